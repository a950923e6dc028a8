#include "granary/fabric/endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include "fabric_objects.h"

namespace granary::fabric {

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kReceiveBuffers = 2;  // one request in flight per connection, and a spare
constexpr std::chrono::milliseconds kWaitSlice{100};  // how often a wait looks at the EQ
constexpr int kConnectAttempts = 4;  // Endpoint::Connect, on a transient connect error

int MillisLeft(Deadline deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, kWaitSlice.count()));
}

void PutLe64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t GetLe64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

std::string SockaddrText(const void* addr, size_t len) {
  char host[INET6_ADDRSTRLEN] = {};
  const auto* sa = static_cast<const sockaddr*>(addr);
  if (sa == nullptr || len < sizeof(sockaddr_in)) return "?";
  if (sa->sa_family == AF_INET) {
    const auto* in = static_cast<const sockaddr_in*>(addr);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (sa->sa_family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
    const auto* in6 = static_cast<const sockaddr_in6*>(addr);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(in6->sin6_port));
  }
  return "?";
}

}  // namespace

std::string EncodeRequestMessage(const RemoteWindow& window, std::string_view frame) {
  std::string out;
  out.reserve(kWindowBytes + frame.size());
  PutLe64(out, window.address);
  PutLe64(out, window.key);
  PutLe64(out, window.length);
  out.append(frame);
  return out;
}

Result<RemoteWindow> DecodeRequestMessage(std::string_view message, std::string_view* frame) {
  if (message.size() < kWindowBytes) {
    return Status::InvalidArgument("a fabric request message of " + std::to_string(message.size()) +
                                   " bytes, shorter than its " + std::to_string(kWindowBytes) +
                                   "-byte window: the reader does not speak Granary's fabric "
                                   "protocol (docs/transport.md)");
  }
  RemoteWindow w{GetLe64(message.data()), GetLe64(message.data() + 8),
                 GetLe64(message.data() + 16)};
  if (frame != nullptr) *frame = message.substr(kWindowBytes);
  return w;
}

// ---- the endpoint ---------------------------------------------------------------------

struct Endpoint::Impl {
  // One operation this endpoint waits for; its address is the libfabric context.
  struct Op {
    fi_context context{};  // first: libfabric may use it (FI_CONTEXT)
    bool is_receive = false;
    size_t receive_index = 0;
  };
  struct Completed {
    size_t receive_index;
    size_t length;
  };

  std::shared_ptr<FabricHandle> fabric;  // outlives the objects below
  std::string provider;
  std::string peer;
  size_t max_message = 0;
  Fid<fid_domain> domain;
  Fid<fid_eq> eq;
  Fid<fid_cq> cq;
  Fid<fid_ep> ep;
  bool cq_waitable = false;
  uint64_t mr_mode = 0;
  uint64_t next_key = 1;
  uint64_t registration_count = 0;

  std::vector<std::vector<char>> receive_buffers;
  std::vector<Fid<fid_mr>> receive_mrs;
  Op receive_ops[kReceiveBuffers];
  std::deque<Completed> received;  // receive completions not yet taken

  std::vector<char> send_buffer;  // FI_MR_LOCAL: sends and writes are staged here
  Fid<fid_mr> send_mr;

  std::vector<char> window;  // the landing window (reader side)
  Fid<fid_mr> window_mr;

  Op send_op;
  std::atomic<bool> closed{false};
  bool is_broken = false;

  ~Impl() {
    // Endpoint first, then what it was bound to, then the domain (Fid order).
    ep.Reset();
    receive_mrs.clear();
    send_mr.Reset();
    window_mr.Reset();
    cq.Reset();
    eq.Reset();
    domain.Reset();
  }

  std::string Where() const { return "fabric connection (" + provider + ") with " + peer; }

  Status Broken(Status status) {
    is_broken = true;
    return status;
  }

  bool NeedsLocalMr() const { return (mr_mode & FI_MR_LOCAL) != 0; }

  Result<Fid<fid_mr>> Register(void* buf, size_t len, uint64_t access) {
    fid_mr* mr = nullptr;
    const uint64_t key = next_key++;
    int rc = fi_mr_reg(domain.get(), buf, len, access, 0, key, 0, &mr, nullptr);
    if (rc != 0) {
      return Status::ResourceExhausted(Where() + ": cannot register " + std::to_string(len) +
                                       " bytes of memory: " + FabricErrorText(-rc) +
                                       " (on verbs, raise the locked-memory limit, ulimit -l)");
    }
    ++registration_count;
    return Fid<fid_mr>(mr);
  }

  // Creates the domain, queues and endpoint for `info` and posts the receives.
  Status Open(fi_info* info, bool has_eq_already) {
    fid_domain* d = nullptr;
    int rc = fi_domain(fabric->fabric, info, &d, nullptr);
    if (rc != 0) return Status::Unavailable(Where() + ": fi_domain: " + FabricErrorText(-rc));
    domain.Reset(d);
    mr_mode = static_cast<uint64_t>(info->domain_attr->mr_mode);
    if (!has_eq_already) {
      fi_eq_attr eq_attr{};
      eq_attr.wait_obj = FI_WAIT_UNSPEC;
      fid_eq* e = nullptr;
      rc = fi_eq_open(fabric->fabric, &eq_attr, &e, nullptr);
      if (rc != 0) return Status::Unavailable(Where() + ": fi_eq_open: " + FabricErrorText(-rc));
      eq.Reset(e);
    }
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_MSG;
    cq_attr.size = 64;
    cq_attr.wait_obj = FI_WAIT_UNSPEC;
    fid_cq* c = nullptr;
    rc = fi_cq_open(domain.get(), &cq_attr, &c, nullptr);
    cq_waitable = rc == 0;
    if (rc != 0) {
      // A provider without wait objects on CQs: poll instead.
      cq_attr.wait_obj = FI_WAIT_NONE;
      rc = fi_cq_open(domain.get(), &cq_attr, &c, nullptr);
      if (rc != 0) return Status::Unavailable(Where() + ": fi_cq_open: " + FabricErrorText(-rc));
    }
    cq.Reset(c);
    fid_ep* e = nullptr;
    rc = fi_endpoint(domain.get(), info, &e, nullptr);
    if (rc != 0) return Status::Unavailable(Where() + ": fi_endpoint: " + FabricErrorText(-rc));
    ep.Reset(e);
    if ((rc = fi_ep_bind(ep.get(), &eq.get()->fid, 0)) != 0 ||
        (rc = fi_ep_bind(ep.get(), &cq.get()->fid, FI_TRANSMIT | FI_RECV)) != 0 ||
        (rc = fi_enable(ep.get())) != 0) {
      return Status::Unavailable(Where() + ": binding the endpoint: " + FabricErrorText(-rc));
    }
    receive_buffers.resize(kReceiveBuffers);
    for (size_t i = 0; i < kReceiveBuffers; ++i) {
      receive_buffers[i].resize(max_message);
      if (NeedsLocalMr()) {
        GRANARY_ASSIGN_OR_RETURN(Fid<fid_mr> mr,
                                 Register(receive_buffers[i].data(), max_message, FI_RECV));
        receive_mrs.push_back(std::move(mr));
      }
      receive_ops[i].is_receive = true;
      receive_ops[i].receive_index = i;
      GRANARY_RETURN_IF_ERROR(PostReceive(i));
    }
    if (NeedsLocalMr()) {
      send_buffer.resize(max_message);
      GRANARY_ASSIGN_OR_RETURN(send_mr,
                               Register(send_buffer.data(), max_message, FI_SEND | FI_WRITE));
    }
    return Status::Ok();
  }

  Status PostReceive(size_t i) {
    void* desc = receive_mrs.empty() ? nullptr : fi_mr_desc(receive_mrs[i].get());
    const ssize_t rc =
        fi_recv(ep.get(), receive_buffers[i].data(), max_message, desc, 0, &receive_ops[i].context);
    if (rc != 0) {
      return Broken(
          Status::Unavailable(Where() + ": fi_recv: " + FabricErrorText(static_cast<int>(-rc))));
    }
    return Status::Ok();
  }

  // A shutdown or an error on the connection's EQ: the peer is gone.
  Status CheckEq() {
    uint32_t event = 0;
    fi_eq_cm_entry entry{};
    ssize_t rc = fi_eq_read(eq.get(), &event, &entry, sizeof(entry), 0);
    if (rc == -FI_EAGAIN) return Status::Ok();
    if (rc == -FI_EAVAIL) {
      fi_eq_err_entry err{};
      fi_eq_readerr(eq.get(), &err, 0);
      return Broken(Status::Unavailable(Where() + ": " + FabricErrorText(err.err)));
    }
    if (rc >= 0 && event == FI_SHUTDOWN) {
      return Broken(Status::Unavailable(Where() + ": the peer closed the connection"));
    }
    return Status::Ok();
  }

  // Waits for one completion; `done` is set to the op it completed.
  // DeadlineExceeded at the deadline (the endpoint is then broken).
  Status WaitOne(Deadline deadline, const std::string& doing) {
    for (;;) {
      if (closed.load()) return Broken(Status::Unavailable(Where() + ": closed"));
      if (is_broken) return Status::Unavailable(Where() + ": the connection broke earlier");
      fi_cq_msg_entry entry{};
      ssize_t rc;
      if (cq_waitable) {
        rc = fi_cq_sread(cq.get(), &entry, 1, nullptr, MillisLeft(deadline));
      } else {
        rc = fi_cq_read(cq.get(), &entry, 1);
        if (rc == -FI_EAGAIN) std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      if (rc == 1) {
        auto* op = reinterpret_cast<Op*>(entry.op_context);
        if (op != nullptr && op->is_receive) {
          received.push_back({op->receive_index, entry.len});
        } else {
          last_completed = op;
        }
        return Status::Ok();
      }
      if (rc == -FI_EAVAIL) {
        fi_cq_err_entry err{};
        fi_cq_readerr(cq.get(), &err, 0);
        const bool truncated = err.err == FI_ETRUNC;
        return Broken(Status(truncated ? StatusCode::kInvalidArgument : StatusCode::kUnavailable,
                             Where() + ": " + doing + ": " + FabricErrorText(err.err) +
                                 (truncated ? " (a message longer than the receive buffer of " +
                                                  std::to_string(max_message) + " bytes)"
                                            : "")));
      }
      if (rc != -FI_EAGAIN && rc < 0) {
        return Broken(Status::Unavailable(
            Where() + ": " + doing + ": fi_cq_read: " + FabricErrorText(static_cast<int>(-rc))));
      }
      GRANARY_RETURN_IF_ERROR(CheckEq());
      if (Clock::now() >= deadline) {
        return Broken(
            Status::DeadlineExceeded(Where() + ": " + doing + ": no completion by the deadline"));
      }
    }
  }

  // Waits for `op` (a send or a write) to complete.
  Status WaitFor(Op* op, Deadline deadline, const std::string& doing) {
    last_completed = nullptr;
    while (last_completed != op) GRANARY_RETURN_IF_ERROR(WaitOne(deadline, doing));
    return Status::Ok();
  }

  // Posts with `post` until the provider takes it (it may say EAGAIN while
  // its queue is full: completions are read meanwhile).
  template <typename Post>
  Status PostRetrying(Post post, Deadline deadline, const std::string& doing) {
    for (;;) {
      if (closed.load()) return Broken(Status::Unavailable(Where() + ": closed"));
      ssize_t rc = post();
      if (rc == 0) return Status::Ok();
      if (rc != -FI_EAGAIN) {
        return Broken(Status::Unavailable(Where() + ": " + doing + ": " +
                                          FabricErrorText(static_cast<int>(-rc))));
      }
      fi_cq_msg_entry entry{};
      ssize_t n = fi_cq_read(cq.get(), &entry, 1);
      if (n == 1) {
        auto* op = reinterpret_cast<Op*>(entry.op_context);
        if (op != nullptr && op->is_receive) received.push_back({op->receive_index, entry.len});
      }
      if (Clock::now() >= deadline) {
        return Broken(Status::DeadlineExceeded(Where() + ": " + doing +
                                               ": the provider took nothing by the deadline"));
      }
    }
  }

  Op* last_completed = nullptr;
};

Endpoint::Endpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Endpoint::~Endpoint() {
  if (impl_ != nullptr && impl_->ep) fi_shutdown(impl_->ep.get(), 0);
}

Result<std::unique_ptr<Endpoint>> Endpoint::Connect(const NetAddress& address,
                                                    const EndpointOptions& options,
                                                    Deadline deadline) {
  const std::string where = "fabric connection (" + options.provider + ") to " + address.ToString();
  GRANARY_ASSIGN_OR_RETURN(InfoList info, GetInfo(options.provider, address.host.c_str(),
                                                  std::to_string(address.port), false, where));
  GRANARY_ASSIGN_OR_RETURN(std::shared_ptr<FabricHandle> fabric, OpenFabric(info.get(), where));
  // The tcp provider of libfabric 1.17 now and then reports a connect that
  // is still under way (EINPROGRESS) as the connect's error, under load (3
  // of ~55 sidecar starts in bench/multihost-benchmark): that endpoint is
  // done for, but a fresh one connects. So a few attempts within the
  // deadline, each on a new endpoint; any other error is final.
  Status last;
  for (int attempt = 0; attempt < kConnectAttempts; ++attempt) {
    if (attempt > 0) {
      if (Clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10 * attempt));
    }
    auto impl = std::make_unique<Impl>();
    impl->fabric = fabric;
    impl->provider = options.provider;
    impl->peer = address.ToString();
    impl->max_message = options.max_message_bytes;
    GRANARY_RETURN_IF_ERROR(impl->Open(info.get(), false));
    const int rc = fi_connect(impl->ep.get(), info.get()->dest_addr, nullptr, 0);
    if (rc != 0) {
      return Status::Unavailable(where + ": fi_connect: " + FabricErrorText(-rc) +
                                 "; check that the cache node serves the fabric there");
    }
    int provider_error = 0;
    last = WaitConnected(impl->eq.get(), deadline, where, &provider_error);
    if (last.ok()) return std::unique_ptr<Endpoint>(new Endpoint(std::move(impl)));
    if (provider_error != EINPROGRESS && provider_error != EAGAIN) return last;
  }
  return last;
}

Status Endpoint::Send(std::string_view message, Deadline deadline) {
  Impl& m = *impl_;
  if (message.size() > m.max_message) {
    return Status::InvalidArgument(m.Where() + ": a message of " + std::to_string(message.size()) +
                                   " bytes, over the " + std::to_string(m.max_message) +
                                   "-byte limit");
  }
  const void* buf = message.data();
  void* desc = nullptr;
  if (m.NeedsLocalMr()) {
    std::memcpy(m.send_buffer.data(), message.data(), message.size());
    buf = m.send_buffer.data();
    desc = fi_mr_desc(m.send_mr.get());
  }
  GRANARY_RETURN_IF_ERROR(m.PostRetrying(
      [&] { return fi_send(m.ep.get(), buf, message.size(), desc, 0, &m.send_op.context); },
      deadline, "send"));
  return m.WaitFor(&m.send_op, deadline, "send");
}

Status Endpoint::Receive(std::string& out, Deadline deadline) {
  Impl& m = *impl_;
  while (m.received.empty()) GRANARY_RETURN_IF_ERROR(m.WaitOne(deadline, "receive"));
  const Impl::Completed done = m.received.front();
  m.received.pop_front();
  out.assign(m.receive_buffers[done.receive_index].data(), done.length);
  return m.PostReceive(done.receive_index);
}

Result<RemoteWindow> Endpoint::Window(uint64_t bytes) {
  Impl& m = *impl_;
  if (!m.window_mr || m.window.size() < bytes) {
    m.window_mr.Reset();
    // Grow by at least half, so a slowly growing READ size does not register every time.
    m.window.resize(std::max<uint64_t>({bytes, m.window.size() + m.window.size() / 2, 4096}));
    GRANARY_ASSIGN_OR_RETURN(
        m.window_mr, m.Register(m.window.data(), m.window.size(), FI_REMOTE_WRITE | FI_WRITE));
  }
  RemoteWindow w;
  w.address = (m.mr_mode & FI_MR_VIRT_ADDR) != 0 ? reinterpret_cast<uint64_t>(m.window.data()) : 0;
  w.key = fi_mr_key(m.window_mr.get());
  w.length = m.window.size();
  return w;
}

std::string_view Endpoint::WindowBytes(uint64_t length) const {
  return std::string_view(impl_->window.data(), std::min<uint64_t>(length, impl_->window.size()));
}

Status Endpoint::Write(const RemoteWindow& window, uint64_t offset, std::string_view bytes,
                       Deadline deadline) {
  Impl& m = *impl_;
  if (offset > window.length || bytes.size() > window.length - offset) {
    return Status::OutOfRange(m.Where() + ": " + std::to_string(bytes.size()) +
                              " bytes at offset " + std::to_string(offset) +
                              " do not fit the reader's window of " +
                              std::to_string(window.length) + " bytes");
  }
  size_t done = 0;
  while (done < bytes.size()) {
    // Staged through the registered send buffer when the provider needs local
    // registration; written straight from the caller's memory when it does not.
    const size_t n = m.NeedsLocalMr() ? std::min(bytes.size() - done, m.send_buffer.size())
                                      : bytes.size() - done;
    const void* buf = bytes.data() + done;
    void* desc = nullptr;
    if (m.NeedsLocalMr()) {
      std::memcpy(m.send_buffer.data(), bytes.data() + done, n);
      buf = m.send_buffer.data();
      desc = fi_mr_desc(m.send_mr.get());
    }
    const uint64_t at = window.address + offset + done;
    GRANARY_RETURN_IF_ERROR(m.PostRetrying(
        [&] { return fi_write(m.ep.get(), buf, n, desc, 0, at, window.key, &m.send_op.context); },
        deadline, "RMA write"));
    GRANARY_RETURN_IF_ERROR(m.WaitFor(&m.send_op, deadline, "RMA write"));
    done += n;
  }
  return Status::Ok();
}

void Endpoint::Close() {
  if (impl_->closed.exchange(true)) return;
  if (impl_->ep) fi_shutdown(impl_->ep.get(), 0);
}

bool Endpoint::broken() const { return impl_->is_broken || impl_->closed.load(); }
const std::string& Endpoint::peer() const { return impl_->peer; }
const std::string& Endpoint::provider() const { return impl_->provider; }
uint64_t Endpoint::registrations() const { return impl_->registration_count; }

// ---- the listener ---------------------------------------------------------------------

struct Listener::Impl {
  std::shared_ptr<FabricHandle> fabric;
  EndpointOptions options;
  std::string where;
  Fid<fid_eq> eq;
  Fid<fid_pep> pep;
  uint16_t port = 0;
  std::atomic<bool> closed{false};

  ~Impl() {
    pep.Reset();
    eq.Reset();
  }
};

Listener::Listener(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Listener::~Listener() = default;

Result<std::unique_ptr<Listener>> Listener::Listen(const NetAddress& address,
                                                   const EndpointOptions& options) {
  const std::string where = "fabric listener (" + options.provider + ") on " + address.ToString();
  GRANARY_ASSIGN_OR_RETURN(InfoList info, GetInfo(options.provider, address.host.c_str(),
                                                  std::to_string(address.port), true, where));
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->where = where;
  GRANARY_ASSIGN_OR_RETURN(impl->fabric, OpenFabric(info.get(), where));
  fi_eq_attr eq_attr{};
  eq_attr.wait_obj = FI_WAIT_UNSPEC;
  fid_eq* e = nullptr;
  int rc = fi_eq_open(impl->fabric->fabric, &eq_attr, &e, nullptr);
  if (rc != 0) return Status::Unavailable(where + ": fi_eq_open: " + FabricErrorText(-rc));
  impl->eq.Reset(e);
  fid_pep* p = nullptr;
  rc = fi_passive_ep(impl->fabric->fabric, info.get(), &p, nullptr);
  if (rc != 0) return Status::Unavailable(where + ": fi_passive_ep: " + FabricErrorText(-rc));
  impl->pep.Reset(p);
  if ((rc = fi_pep_bind(impl->pep.get(), &impl->eq.get()->fid, 0)) != 0 ||
      (rc = fi_listen(impl->pep.get())) != 0) {
    return Status::Unavailable(where + ": cannot listen: " + FabricErrorText(-rc) +
                               (rc == -FI_EADDRINUSE ? "; the port is taken: choose another" : ""));
  }
  sockaddr_storage bound{};
  size_t len = sizeof(bound);
  rc = fi_getname(&impl->pep.get()->fid, &bound, &len);
  if (rc != 0) return Status::Unavailable(where + ": fi_getname: " + FabricErrorText(-rc));
  const auto* sa = reinterpret_cast<const sockaddr*>(&bound);
  impl->port = sa->sa_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                         : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return std::unique_ptr<Listener>(new Listener(std::move(impl)));
}

Result<std::unique_ptr<Endpoint>> Listener::Accept(Deadline deadline) {
  Impl& l = *impl_;
  for (;;) {
    if (l.closed.load()) return Status::Unavailable(l.where + ": closed");
    uint32_t event = 0;
    fi_eq_cm_entry entry{};
    ssize_t rc = fi_eq_sread(l.eq.get(), &event, &entry, sizeof(entry), MillisLeft(deadline), 0);
    if (rc == -FI_EAGAIN || rc == -FI_ETIMEDOUT) {
      if (Clock::now() >= deadline) return Status::DeadlineExceeded(l.where + ": no connection");
      continue;
    }
    if (rc == -FI_EAVAIL) {
      fi_eq_err_entry err{};
      fi_eq_readerr(l.eq.get(), &err, 0);
      continue;  // a failed connection request: wait for the next
    }
    if (rc < 0) {
      return Status::Unavailable(l.where +
                                 ": fi_eq_sread: " + FabricErrorText(static_cast<int>(-rc)));
    }
    if (event != FI_CONNREQ) {
      InfoList unused(entry.info);  // freed
      continue;
    }
    InfoList info(entry.info);
    auto impl = std::make_unique<Endpoint::Impl>();
    impl->fabric = l.fabric;
    impl->provider = l.options.provider;
    impl->peer = SockaddrText(info.get()->dest_addr, info.get()->dest_addrlen);
    impl->max_message = l.options.max_message_bytes;
    Status opened = impl->Open(info.get(), false);
    if (!opened.ok()) {
      fi_reject(l.pep.get(), info.get()->handle, nullptr, 0);
      continue;
    }
    if (fi_accept(impl->ep.get(), nullptr, 0) != 0) continue;
    const Deadline connected_by = std::min(deadline, Clock::now() + std::chrono::seconds(5));
    if (!WaitConnected(impl->eq.get(), connected_by, l.where).ok()) continue;
    return std::unique_ptr<Endpoint>(new Endpoint(std::move(impl)));
  }
}

void Listener::Close() { impl_->closed.store(true); }
uint16_t Listener::port() const { return impl_->port; }

}  // namespace granary::fabric

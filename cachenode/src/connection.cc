#include "connection.h"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cstring>
#include <utility>
#include <variant>

#include "granary/core/names.h"

namespace granary::server_internal {

void Connection::Start() {
  const auto now = SteadyClock::now();
  accepted_at_ = now;
  last_activity_ = now;
  last_write_progress_ = now;
  ErrorCode ec;
  socket_.set_option(tcp::no_delay(true), ec);
  socket_.native_non_blocking(true, ec);
  if (ec) {
    server_.WarnAboutClient("connection from " + gauge_->peer_address +
                            ": cannot make its socket non-blocking: " + ec.message());
    Close();
    return;
  }
  if (server_.options().tls != nullptr) {
    Result<std::unique_ptr<TlsStream>> tls =
        TlsStream::Accept(server_.options().tls, socket_.native_handle());
    if (!tls.ok()) {
      server_.WarnAboutClient("connection from " + gauge_->peer_address + ": " +
                              tls.status().message());
      Close();
      return;
    }
    tls_ = std::move(*tls);
    Handshake();
    return;
  }
  Pump();
}

void Connection::Sweep(SteadyClock::time_point now) {
  const ServerOptions& o = server_.options();
  if (phase_ == Phase::kClosed) return;
  if (phase_ == Phase::kLingering) {
    if (now >= linger_deadline_) Close();
    return;
  }
  if (write_waiting_ && now - last_write_progress_ >= o.reply_stall_timeout &&
      server_.budget().has_waiters() && ReservedBytes() > 0) {
    // It holds reply bytes others wait for, and its client reads nothing:
    // sooner than write_timeout, or a few such clients would hold the
    // whole budget (and every other reader) for write_timeout.
    Add(server_.counters().timeouts);
    Add(server_.counters().reply_stall_closes);
    server_.WarnAboutClient("connection " + Describe() + ": held " +
                            std::to_string(ReservedBytes()) +
                            " bytes of the reply budget that other requests wait for, and the "
                            "client took no reply bytes for " +
                            Millis(o.reply_stall_timeout) + " (reply_stall_timeout); closed it");
    Close();
    return;
  }
  if (write_waiting_ && now - last_write_progress_ >= o.write_timeout) {
    Add(server_.counters().timeouts);
    server_.WarnAboutClient("connection " + Describe() + ": the client took no reply bytes for " +
                            Millis(o.write_timeout) + " (write_timeout); closed it");
    Close();
    return;
  }
  if (input_stopped_) return;
  const bool hello_done = session_.hello_done();
  if ((!hello_done || !session_.authenticated()) && queue_.empty() &&
      now - accepted_at_ >= o.handshake_timeout) {
    Add(server_.counters().timeouts);
    StopInput(Status::DeadlineExceeded(
                  std::string(hello_done ? "not authenticated" : "no HELLO") + " within " +
                  Millis(o.handshake_timeout) +
                  " of connecting (handshake_timeout); open every connection with HELLO" +
                  (hello_done ? " and AUTH" : "")),
              hello_done ? "not authenticated in time" : "no HELLO in time");
    return;
  }
  if (frame_started_.has_value()) {
    if (!reading_) {
      // Back-pressure stopped reading: the client is not to blame for the
      // frame not progressing. Its clock restarts when reading does.
      frame_started_ = now;
    } else if (now - *frame_started_ >= o.frame_timeout) {
      Add(server_.counters().timeouts);
      StopInput(Status::DeadlineExceeded(
                    "a frame stayed incomplete for " + Millis(o.frame_timeout) + " (got " +
                    std::to_string(bytes_since_frame_) +
                    " bytes of it; frame_timeout); send whole frames without pausing"),
                "frame incomplete in time");
      return;
    }
  }
  if (hello_done && queue_.empty() && !frame_started_.has_value() &&
      now - last_activity_ >= o.idle_timeout) {
    Add(server_.counters().timeouts);
    StopInput(Status::DeadlineExceeded("idle for " + Millis(o.idle_timeout) +
                                       " (idle_timeout); reconnect to send more requests"),
              "");
  }
}

void Connection::BeginDrain() {
  if (phase_ == Phase::kClosed) return;
  if (phase_ == Phase::kLingering || queue_.empty()) {
    Close();
    return;
  }
  input_stopped_ = true;
  receive_begin_ = receive_end_ = 0;
  close_when_answered_ = true;
  UpdateGauge();
}

void Connection::Close() {
  if (phase_ == Phase::kClosed) return;
  phase_ = Phase::kClosed;
  gone_.store(true, std::memory_order_release);
  ErrorCode ec;
  if (tls_ != nullptr && tls_ready_) tls_->Shutdown();
  socket_.close(ec);  // cancels the outstanding read and wait
  queue_.clear();     // releases the answers (open chunk readers, buffers)
  decoder_ = FrameDecoder(FrameDirection::kRequests, server_.options().limits);
  receive_begin_ = receive_end_ = 0;
  UpdateGauge();
  auto self = shared_from_this();  // keep alive while erasing ourselves
  worker_.connections.erase(id_);
  server_.OnConnectionClosed(id_);
}

std::string Connection::Describe() const {
  return std::to_string(id_) + " from " + gauge_->peer_address +
         (session_.peer_name().empty() ? std::string() : " (" + Quoted(session_.peer_name()) + ")");
}

void Connection::Pump() {
  if (phase_ == Phase::kClosed) return;
  if (pumping_) {
    pump_again_ = true;
    return;
  }
  pumping_ = true;
  int round = 0;
  do {
    pump_again_ = false;
    StartService();
    Write();
    ReadInput();
  } while (pump_again_ && phase_ != Phase::kClosed && ++round < kMaxPumpRounds);
  pumping_ = false;
  if (pump_again_ && phase_ != Phase::kClosed) PostPump();
  UpdateGauge();
}

void Connection::PostPump() {
  auto self = shared_from_this();
  asio::post(worker_.io, [self] { self->Pump(); });
}

bool Connection::AcceptsRequests() const {
  return phase_ == Phase::kOpen && !input_stopped_ &&
         queue_.size() < server_.options().max_in_flight &&
         ReservedBytes() < server_.options().ConnectionReplyBufferBytes();
}

uint64_t Connection::ReservedBytes() const {
  uint64_t total = 0;
  for (const auto& work : queue_) total += work->reservation.bytes();
  return total;
}

void Connection::ReadInput() {
  if (phase_ == Phase::kClosed || reading_) return;
  if (phase_ == Phase::kOpen) {
    if (input_stopped_) return;
    ProcessInput();
    if (!AcceptsRequests() || receive_begin_ < receive_end_) return;
  }
  reading_ = true;
  gauge_->reading.store(phase_ == Phase::kOpen, std::memory_order_relaxed);
  auto self = shared_from_this();
  if (tls_ != nullptr && phase_ == Phase::kOpen) {
    ReadTls();
    return;
  }
  socket_.async_read_some(asio::buffer(receive_.get(), receive_capacity_),
                          [self](const ErrorCode& ec, size_t n) { self->OnRead(ec, n); });
}

void Connection::ReadTls() {
  auto self = shared_from_this();
  TlsWant want = TlsWant::kNothing;
  Result<size_t> n = tls_->Read(receive_.get(), receive_capacity_, &want);
  if (!n.ok()) {
    server_.log().debug("connection {}: {}", Describe(), n.status().ToString());
    asio::post(worker_.io, [self] { self->OnRead(asio::error::connection_reset, 0); });
    return;
  }
  if (*n > 0 || want == TlsWant::kNothing) {
    // Posted, not called: a client with much buffered input must not
    // recurse through Pump.
    const size_t got = *n;
    asio::post(worker_.io, [self, got] {
      self->OnRead(got > 0 ? ErrorCode() : ErrorCode(asio::error::eof), got);
    });
    return;
  }
  socket_.async_wait(want == TlsWant::kRead ? Socket::wait_read : Socket::wait_write,
                     [self](const ErrorCode& ec) {
                       if (ec) {
                         self->OnRead(ec, 0);
                         return;
                       }
                       if (self->phase_ != Phase::kOpen) {
                         self->OnRead(asio::error::operation_aborted, 0);
                         return;
                       }
                       self->ReadTls();
                     });
}

void Connection::OnRead(const ErrorCode& ec, size_t n) {
  reading_ = false;
  gauge_->reading.store(false, std::memory_order_relaxed);
  if (phase_ == Phase::kClosed) return;
  if (phase_ == Phase::kLingering) {
    linger_bytes_ += n;
    if (ec || n == 0 || linger_bytes_ > kMaxLingerBytes) {
      Close();
    } else {
      Pump();
    }
    return;
  }
  if (ec == asio::error::eof || (!ec && n == 0)) {
    OnEndOfInput();
    return;
  }
  if (ec) {
    if (ec != asio::error::operation_aborted) Close();  // reset by the peer, or worse
    return;
  }
  Add(server_.counters().received_bytes, n);
  last_activity_ = SteadyClock::now();
  if (!input_stopped_) {
    receive_begin_ = 0;
    receive_end_ = n;
  }  // else a closing ERROR is on its way, or the server drains: discard
  Pump();
}

void Connection::OnEndOfInput() {
  // The client shut its side: answer what it asked (it may still read), then close.
  Status cut = decoder_.Finish();
  if (!cut.ok() && !input_stopped_) {
    Add(server_.counters().truncated_frames);
    server_.log().debug("connection {}: {}", Describe(), cut.message());
  }
  StopReading();
  close_when_answered_ = true;
  if (queue_.empty()) {
    Close();
    return;
  }
  Pump();
}

void Connection::ProcessInput() {
  // Each round consumes bytes or takes a frame: the receive buffer bounds it.
  while (receive_begin_ < receive_end_ && AcceptsRequests()) {
    std::string_view data(receive_.get() + receive_begin_, receive_end_ - receive_begin_);
    Result<size_t> used = decoder_.Feed(data);
    if (!used.ok()) {
      OnFramingError(used.status());
      return;
    }
    receive_begin_ += *used;
    if (decoder_.has_frame()) {
      frame_started_.reset();
      bytes_since_frame_ = 0;
      OnFrame(decoder_.TakeFrame());
      continue;
    }
    if (*used > 0) {
      bytes_since_frame_ += *used;
      if (!frame_started_.has_value()) frame_started_ = SteadyClock::now();
    }
  }
  if (receive_begin_ == receive_end_) receive_begin_ = receive_end_ = 0;
}

void Connection::OnFramingError(const Status& status) {
  Add(server_.counters().framing_errors);
  server_.WarnAboutClient("connection " + Describe() + ": " + status.ToString() +
                          "; answered ERROR and closed it");
  // The stream cannot be trusted: drop what was not started (a half-sent
  // reply must be finished, or the ERROR would land inside it).
  std::deque<std::unique_ptr<Work>> keep;
  if (!queue_.empty() && (send_piece_ != 0 || send_offset_ != 0)) {
    keep.push_back(std::move(queue_.front()));
  }
  queue_.swap(keep);
  StopInputNow(status);
}

void Connection::StopInput(const Status& status, std::string_view why) {
  if (!why.empty()) {
    server_.WarnAboutClient("connection " + Describe() + ": " + std::string(why) +
                            "; answered ERROR and closed it");
  }
  StopInputNow(status);
}

void Connection::StopReading() {
  input_stopped_ = true;
  receive_begin_ = receive_end_ = 0;
  frame_started_.reset();
}

void Connection::StopInputNow(const Status& status) {
  StopReading();
  QueueReady(0, 0, ErrorFrame(0, status, true, session_.error_version()), /*close_after=*/true);
}

void Connection::OnFrame(Frame frame) {
  const uint64_t id = frame.header.request_id;
  const uint16_t type = frame.header.type;
  SessionStep step = session_.OnFrame(frame);
  NoteStep(id, step);
  if (step.hello_agreed) {
    decoder_.ExpectVersion(session_.version());
    std::lock_guard lock(gauge_->mu);
    gauge_->peer_name = session_.peer_name();
  }
  if (step.service.has_value()) {
    auto work = NewWork(id, type);
    const auto* auth = std::get_if<AuthRequest>(&*step.service);
    work->request_bytes = auth != nullptr ? auth->credential.size() : frame.body.size();
    work->service_request = std::move(step.service);
    queue_.push_back(std::move(work));
    Pump();
    return;
  }
  // A closing ERROR: the connection reads nothing more and closes once it is sent.
  if (step.closing) StopReading();
  QueueReady(id, type, std::move(step.reply), step.closing);
}

void Connection::StartService() {
  if (phase_ != Phase::kOpen) return;
  auto it = std::find_if(queue_.begin(), queue_.end(), [](const auto& w) {
    return w->running || w->service_request.has_value();
  });
  if (it == queue_.end() || (*it)->running) return;
  Work& work = **it;
  if (!Reserve(work)) return;
  work.running = true;
  auto request = std::make_shared<const ServiceRequest>(std::move(*work.service_request));
  work.service_request.reset();
  work.request_bytes = 0;
  auto self = shared_from_this();
  const uint64_t seq = work.seq;
  const uint64_t request_id = work.request_id;
  const uint16_t version = session_.version();
  asio::post(server_.pool(), [self, seq, request_id, version, request] {
    // A connection that is gone needs no answer: do not spend a disk read on it.
    if (self->gone_.load(std::memory_order_acquire)) return;
    auto result =
        std::make_shared<ServiceResult>(self->server_.RunService(*request, request_id, version));
    asio::post(self->worker_.io, [self, seq, result] { self->OnServiceDone(seq, *result); });
  });
}

bool Connection::Reserve(Work& work) {
  if (work.reservation.held()) return true;
  const auto* read = std::get_if<ReadRequest>(&*work.service_request);
  if (read == nullptr) return true;  // STAT: a small reply, not reserved
  if (budget_wait_registered_) return false;
  const uint64_t need = RequestedBytes(*read);
  const uint64_t held = ReservedBytes();
  if (held > 0 && held + need > server_.options().ConnectionReplyBufferBytes()) {
    if (!work.waited_for_connection) {
      work.waited_for_connection = true;
      Add(server_.counters().connection_reply_waits);
    }
    return false;
  }
  std::weak_ptr<Connection> weak = weak_from_this();
  asio::io_context& io = worker_.io;
  const bool reserved = server_.budget().ReserveOrWait(need, [weak, &io] {
    asio::post(io, [weak] {
      if (auto self = weak.lock()) {
        self->budget_wait_registered_ = false;
        self->Pump();
      }
    });
  });
  if (!reserved) {
    budget_wait_registered_ = true;
    if (!work.waited_for_budget) {
      work.waited_for_budget = true;
      Add(server_.counters().reply_budget_waits);
    }
    return false;
  }
  work.reservation = BudgetReservation(&server_.budget(), need);
  return true;
}

void Connection::OnServiceDone(uint64_t seq, ServiceResult& result) {
  if (phase_ == Phase::kClosed) return;  // the answer is released with `result`
  auto it =
      std::find_if(queue_.begin(), queue_.end(), [seq](const auto& w) { return w->seq == seq; });
  if (it == queue_.end()) return;  // dropped after a framing error
  Work& work = **it;
  work.running = false;
  work.ready = true;
  if (result.granted.has_value()) {
    session_.Grant(std::move(*result.granted));
    OnGranted();
  }
  if (result.close_after) {
    work.close_after = true;
    StopReading();
  }
  work.frame = std::move(result.frame);
  work.answer = std::move(result.answer);
  work.items = result.items;
  work.item_errors = result.item_errors;
  work.reply_memory =
      work.frame.header.size() + (work.answer.has_value() ? work.answer->memory_bytes() : 0);
  // File ranges (sendfile) and an ERROR instead of the bytes hold no memory:
  // give the rest back now.
  work.reservation.Resize(work.reply_memory);
  Pump();
}

std::unique_ptr<Connection::Work> Connection::NewWork(uint64_t request_id, uint16_t type) {
  auto work = std::make_unique<Work>();
  work->seq = ++next_seq_;
  work->request_id = request_id;
  work->type = type;
  work->decoded_at = SteadyClock::now();
  return work;
}

void Connection::QueueReady(uint64_t request_id, uint16_t type, OutgoingFrame frame,
                            bool close_after) {
  auto work = NewWork(request_id, type);
  work->ready = true;
  work->reply_memory = frame.header.size();
  work->frame = std::move(frame);
  work->close_after = close_after;
  queue_.push_back(std::move(work));
  Pump();
}

}  // namespace granary::server_internal

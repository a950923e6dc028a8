// The reply writer: how a connection sends its replies, in order, from the
// front of its queue: memory pieces by sendmsg, file ranges by sendfile, both
// through TLS when the server has it; then it counts each reply and, after a
// closing ERROR, lingers (connection.h).

#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <variant>

#include "connection.h"
#include "granary/core/file.h"

namespace granary::server_internal {

constexpr size_t kMaxIov = 64;
// sendfile(2) moves at most this many bytes per call (Linux: 0x7ffff000).
constexpr uint64_t kMaxSendfileBytes = 0x7ffff000;
// What one TLS write takes of a piece (OpenSSL cuts it into 16 KiB records).
constexpr uint64_t kTlsWriteBytes = 256u << 10;

// Bounds the write loop of one turn (with write_quantum_bytes).
constexpr int kMaxWriteRounds = 4096;

// What one piece of an outgoing frame is: piece 0 is the header (fixed header
// and body), piece k > 0 is payload piece k - 1.
struct PieceRef {
  std::string_view memory;
  const FileRange* file = nullptr;
  uint64_t size() const { return file != nullptr ? file->length : memory.size(); }
};

PieceRef PieceAt(const OutgoingFrame& frame, size_t piece) {
  if (piece == 0) return PieceRef{frame.header, nullptr};
  const PayloadPiece& p = frame.payload[piece - 1];
  if (const auto* f = std::get_if<FileRange>(&p)) return PieceRef{{}, f};
  return PieceRef{std::get<std::string_view>(p), nullptr};
}

void Connection::Write() {
  if (phase_ != Phase::kOpen || write_waiting_) return;
  const int fd = socket_.native_handle();
  uint64_t budget = server_.options().write_quantum_bytes;
  for (int round = 0; round < kMaxWriteRounds; ++round) {
    if (queue_.empty() || !queue_.front()->ready) return;
    Work& work = *queue_.front();
    const size_t pieces = 1 + work.frame.payload.size();
    if (send_piece_ >= pieces) {
      FinishFront();
      if (phase_ != Phase::kOpen) return;
      continue;
    }
    if (budget == 0) {
      PostPump();  // let the loop's other connections run first
      return;
    }
    PieceRef piece = PieceAt(work.frame, send_piece_);
    ssize_t n = 0;
    bool by_sendfile = false;
    if (tls_ != nullptr) {
      Result<uint64_t> written = WriteTls(work, piece, budget);
      if (!written.ok()) {
        SendFailed(work, written.status().message());
        return;
      }
      if (*written == 0) {
        WaitWritable();
        return;
      }
      budget -= std::min<uint64_t>(budget, *written);
      Advance(work, *written, false);
      continue;
    }
    if (piece.file == nullptr) {
      iovec iov[kMaxIov];
      size_t count = 0;
      uint64_t total = 0;
      for (size_t p = send_piece_; p < pieces && count < kMaxIov && total < budget; ++p) {
        PieceRef ref = PieceAt(work.frame, p);
        if (ref.file != nullptr) break;
        std::string_view bytes = ref.memory.substr(p == send_piece_ ? send_offset_ : 0);
        bytes =
            bytes.substr(0, static_cast<size_t>(std::min<uint64_t>(bytes.size(), budget - total)));
        if (bytes.empty()) continue;
        iov[count].iov_base = const_cast<char*>(bytes.data());
        iov[count].iov_len = bytes.size();
        ++count;
        total += bytes.size();
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = count;
      n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    } else {
      const FileRange& range = *piece.file;
      uint64_t want = std::min({range.length - send_offset_, budget, kMaxSendfileBytes});
      auto offset = static_cast<off_t>(range.offset + send_offset_);
      n = ::sendfile(fd, range.fd, &offset, static_cast<size_t>(want));
      by_sendfile = true;
      if (n == 0) {
        SendFailed(work, "sendfile of " + std::to_string(range.length) + " bytes from offset " +
                             std::to_string(range.offset) +
                             " reached the end of the file early: the file is shorter than "
                             "the read service said");
        return;
      }
    }
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        WaitWritable();
        return;
      }
      if (err == EPIPE || err == ECONNRESET || err == ENOTCONN) {
        // The client went away mid-reply: nothing to fix, nothing to warn about.
        Add(server_.counters().send_errors);
        server_.log().debug("connection {}: client gone mid-reply: {}", Describe(), ErrnoText(err));
        Close();
        return;
      }
      SendFailed(work, std::string(by_sendfile ? "sendfile" : "sendmsg") + ": " + ErrnoText(err));
      return;
    }
    budget -= std::min<uint64_t>(budget, static_cast<uint64_t>(n));
    Advance(work, static_cast<uint64_t>(n), by_sendfile);
  }
  PostPump();
}

Result<uint64_t> Connection::WriteTls(const Work& work, const PieceRef& piece, uint64_t budget) {
  const uint64_t left = piece.size() - send_offset_;
  const size_t length = static_cast<size_t>(std::min({left, budget, kTlsWriteBytes}));
  const char* data = nullptr;
  if (piece.file == nullptr) {
    data = piece.memory.data() + send_offset_;
  } else {
    const FileRange& range = *piece.file;
    const uint64_t offset = range.offset + send_offset_;
    if (tls_scratch_offset_ != offset || tls_scratch_fd_ != range.fd ||
        tls_scratch_.size() != length) {
      tls_scratch_.resize(length);
      Status read = PreadFull(range.fd, tls_scratch_.data(), length, offset, "a chunk file");
      if (!read.ok()) {
        tls_scratch_fd_ = -1;
        return Status(read.code(), "reading the reply of request " +
                                       std::to_string(work.request_id) + ": " + read.message());
      }
      tls_scratch_offset_ = offset;
      tls_scratch_fd_ = range.fd;
    }
    data = tls_scratch_.data();
  }
  TlsWant want = TlsWant::kNothing;
  Result<size_t> n = tls_->Write(data, length, &want);
  if (!n.ok()) return n.status();
  if (*n > 0 && piece.file != nullptr) tls_scratch_fd_ = -1;  // the next bytes differ
  return uint64_t{*n};
}

void Connection::SendFailed(const Work& work, const std::string& what) {
  Add(server_.counters().send_errors);
  server_.log().warn(
      "connection {}: sending the reply to request {} failed: {}; closed the connection "
      "mid-reply (the client sees it cut and retries)",
      Describe(), work.request_id, what);
  Close();
}

void Connection::Advance(const Work& work, uint64_t n, bool by_sendfile) {
  AtomicCounters& c = server_.counters();
  Add(c.sent_bytes, n);
  gauge_->sent.fetch_add(n, std::memory_order_relaxed);
  if (by_sendfile) Add(c.sendfile_bytes, n);
  last_write_progress_ = SteadyClock::now();
  last_activity_ = last_write_progress_;
  const size_t pieces = 1 + work.frame.payload.size();
  while (send_piece_ < pieces) {
    PieceRef piece = PieceAt(work.frame, send_piece_);
    uint64_t step = std::min(n, piece.size() - send_offset_);
    send_offset_ += step;
    n -= step;
    if (send_piece_ > 0) Add(c.payload_bytes, step);
    if (piece.file == nullptr) front_memory_sent_ += step;
    if (send_offset_ < piece.size()) break;
    ++send_piece_;
    send_offset_ = 0;
  }
}

void Connection::FinishFront() {
  std::unique_ptr<Work> work = std::move(queue_.front());
  queue_.pop_front();
  send_piece_ = 0;
  send_offset_ = 0;
  front_memory_sent_ = 0;
  AtomicCounters& c = server_.counters();
  if (work->type != 0) {
    Add(c.requests);
    gauge_->requests.fetch_add(1, std::memory_order_relaxed);
    switch (work->type) {
      case pf::kTypeHello:
        Add(c.hello);
        break;
      case pf::kTypePing:
        Add(c.ping);
        break;
      case pf::kTypeStat:
        Add(c.stat);
        break;
      case pf::kTypeRead:
        Add(c.read);
        Add(c.read_items, work->items);
        Add(c.read_item_errors, work->item_errors);
        break;
      default:
        break;
    }
    server_.RecordLatency(SteadyClock::now() - work->decoded_at);
  }
  if (work->close_after) {
    StartLinger();
    return;
  }
  if (close_when_answered_ && queue_.empty()) {
    Close();
    return;
  }
  Pump();  // below the in-flight bound again: read, start the next request
}

void Connection::WaitWritable() {
  write_waiting_ = true;
  gauge_->write_blocked.store(true, std::memory_order_relaxed);
  auto self = shared_from_this();
  socket_.async_wait(Socket::wait_write, [self](const ErrorCode& ec) {
    self->write_waiting_ = false;
    self->gauge_->write_blocked.store(false, std::memory_order_relaxed);
    if (self->phase_ != Phase::kOpen) return;
    if (ec) {
      if (ec != asio::error::operation_aborted) self->Close();
      return;
    }
    self->Pump();
  });
}

void Connection::StartLinger() {
  phase_ = Phase::kLingering;
  linger_deadline_ = SteadyClock::now() + kLingerTime;
  queue_.clear();
  ErrorCode ec;
  socket_.shutdown(tcp::socket::shutdown_send, ec);
  if (ec) {
    Close();
    return;
  }
  Pump();  // arms the discarding read
}

void Connection::UpdateGauge() {
  uint64_t bytes = 0;
  if (phase_ != Phase::kClosed) {
    bytes = (receive_end_ - receive_begin_) + decoder_.buffered_bytes();
    for (const auto& work : queue_) bytes += work->request_bytes + work->reply_memory;
    bytes -= std::min(bytes, front_memory_sent_);
  }
  server_.NoteBuffered(buffered_, bytes);
  buffered_ = bytes;
  gauge_->buffered.store(bytes, std::memory_order_relaxed);
  gauge_->reserved.store(phase_ != Phase::kClosed ? ReservedBytes() : 0, std::memory_order_relaxed);
  gauge_->in_flight.store(static_cast<uint32_t>(queue_.size()), std::memory_order_relaxed);
}

}  // namespace granary::server_internal

#pragma once

// Connection: one client connection of the cache node server (server.h),
// private to cachenode/src. The protocol's rules (HELLO, AUTH, what an
// identity may read) are its PeerSession's (peer_session.h); its work is in
// three files, by job:
//  - connection.cc: its life (start, timeouts, drain, close), reading and
//    decoding requests, doing what the session says with each, and the
//    service pool;
//  - connection_auth.cc: the TLS handshake, and the session's verdicts on
//    authentication applied to the connection;
//  - reply_writer.cc: writing replies (sendmsg, sendfile, TLS), counting
//    them, and lingering after a closing ERROR.

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "granary/peer/peer_auth.h"
#include "granary/peer/tls.h"
#include "granary/protocol/protocol.h"
#include "granary/protocol/protocol_format.h"
#include "peer_session.h"
#include "server_core.h"

namespace granary::server_internal {

// One piece of an outgoing frame (reply_writer.cc).
struct PieceRef;

// One client connection, owned by one loop for its whole life: every method
// runs on that loop's thread, except the pool task in StartService, which
// touches only its own copy of the request and `gone_`.
//
// Progress is made in one place, Pump(), which every event handler calls
// (bytes read, socket writable, service answer, a timeout). The steps it runs
// (start the service, write, read) never call each other, so a burst of
// pipelined requests cannot recurse; a step that enables another sets
// pump_again_ through Pump() and the loop in Pump runs it.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(ServerCore& server, Worker& worker, Socket socket, uint64_t id,
             std::shared_ptr<ConnectionGauge> gauge)
      : server_(server),
        worker_(worker),
        socket_(std::move(socket)),
        id_(id),
        gauge_(std::move(gauge)),
        session_(server.options(), [this] { return ChannelBinding(); }),
        decoder_(FrameDirection::kRequests, server.options().limits),
        receive_capacity_(static_cast<size_t>(std::min<uint64_t>(
            server.options().receive_chunk_bytes, server.options().limits.max_message_bytes))),
        receive_(std::make_unique<char[]>(receive_capacity_)) {}

  void Start();

  // Timeouts; called by the loop's sweep timer.
  void Sweep(SteadyClock::time_point now);

  // Stop(): read no more requests; close once the ones already decoded are
  // answered.
  void BeginDrain();

  void Close();

 private:
  enum class Phase {
    kOpen,       // reading (unless input_stopped_) and answering
    kLingering,  // last reply sent, write side shut: discarding input until EOF
    kClosed,
  };

  // A request decoded and not yet fully answered, in arrival order.
  struct Work {
    // First, so that it is released after the memory below is freed.
    BudgetReservation reservation;       // of a READ, from its start until its reply is gone
    bool waited_for_budget = false;      // counted in reply_budget_waits
    bool waited_for_connection = false;  // counted in connection_reply_waits
    uint64_t seq = 0;
    uint64_t request_id = 0;
    uint16_t type = 0;  // request type, for the counters; 0: not a request (a closing ERROR)
    SteadyClock::time_point decoded_at;
    std::optional<ServiceRequest> service_request;  // until started
    uint64_t request_bytes = 0;                     // memory the request holds until started
    bool running = false;                           // with the service pool
    bool ready = false;                             // frame holds the reply
    OutgoingFrame frame;
    std::optional<ReadAnswer> answer;  // what the frame's payload points into
    uint64_t reply_memory = 0;         // header + memory payload of the reply
    bool close_after = false;          // the reply is a closing ERROR
    uint64_t items = 0;
    uint64_t item_errors = 0;
  };

  // Bounds one Pump; a connection with more to do continues on a later turn.
  static constexpr int kMaxPumpRounds = 256;

  std::string Describe() const;

  void Pump();

  void PostPump();

  // ---- input ----

  // Back-pressure: at max_in_flight, or holding its share of the reply budget
  // (its client is not reading its replies), the connection neither decodes
  // nor reads its socket.
  bool AcceptsRequests() const;

  // Bytes this connection's requests hold of the reply budget.
  uint64_t ReservedBytes() const;

  // Decodes what was received while requests are accepted, then reads more if
  // everything was consumed; while lingering, reads to discard.
  void ReadInput();

  // Decrypted bytes may wait inside OpenSSL without the socket being
  // readable: read first, wait for the socket only when OpenSSL asks to.
  void ReadTls();

  // The TLS handshake, before anything else (handshake_timeout bounds it).
  void Handshake();

  void OnRead(const ErrorCode& ec, size_t n);

  void OnEndOfInput();

  // Feeds received bytes to the decoder while the connection accepts requests.
  void ProcessInput();

  void OnFramingError(const Status& status);

  // Stops reading; queues ERROR (request id 0, closing) after the replies in flight.
  void StopInput(const Status& status, std::string_view why);

  // Reads no more requests and drops what was received and not decoded.
  void StopReading();

  void StopInputNow(const Status& status);

  void OnFrame(Frame frame);

  // ---- the session's verdicts (protocol version 2: authentication) ----

  // Counts and logs what the session's step names.
  void NoteStep(uint64_t id, const SessionStep& step);

  // The session granted an identity (a proof, or a token from the pool): the
  // connection no longer counts among its address's unauthenticated ones.
  void OnGranted();

  // The TLS session's channel binding, which the cluster key's proofs cover
  // (empty without TLS).
  Result<std::string> ChannelBinding() const;

  std::unique_ptr<Work> NewWork(uint64_t request_id, uint16_t type);

  void QueueReady(uint64_t request_id, uint16_t type, OutgoingFrame frame, bool close_after);

  // ---- the service pool ----

  // Starts the first request that needs the service, unless one is running:
  // one call per connection at a time, in arrival order.
  void StartService();

  // A READ's reply bytes from the reply budget, before it starts: true when
  // reserved. Else it waits, for its own replies to be read (FinishFront pumps
  // again) or for the budget (ReplyBudget wakes it).
  bool Reserve(Work& work);

  void OnServiceDone(uint64_t seq, ServiceResult& result);

  // ---- output ----

  // Sends ready replies from the front of the queue until the socket is full,
  // nothing is ready, or this turn's quantum is spent.
  void Write();

  // One TLS record's worth of the current piece: memory as it is, a file
  // range read into tls_scratch_ first (no sendfile through TLS). 0: the
  // socket is full (WaitWritable); a retry sends the same bytes, as OpenSSL
  // requires.
  Result<uint64_t> WriteTls(const Work& work, const PieceRef& piece, uint64_t budget);

  void SendFailed(const Work& work, const std::string& what);

  void Advance(const Work& work, uint64_t n, bool by_sendfile);

  // The front reply is sent: count it and pop it.
  void FinishFront();

  void WaitWritable();

  // The last reply (a closing ERROR) is out: shut our side, then read and
  // discard until the client closes too (or kLingerTime), so that the kernel
  // does not reset the connection over unread bytes before the client has
  // read the ERROR.
  void StartLinger();

  void UpdateGauge();

  ServerCore& server_;
  Worker& worker_;
  Socket socket_;
  const uint64_t id_;
  const std::shared_ptr<ConnectionGauge> gauge_;
  std::atomic<bool> gone_{false};  // read by pool tasks

  Phase phase_ = Phase::kOpen;
  bool pumping_ = false;
  bool pump_again_ = false;
  bool input_stopped_ = false;        // no more requests will be read
  bool close_when_answered_ = false;  // close once the queue is empty
  // TLS (ServerOptions::tls): the stream over socket_, and a file range read
  // for it (sendfile cannot go through TLS).
  std::unique_ptr<TlsStream> tls_;
  bool tls_ready_ = false;
  std::string tls_scratch_;
  uint64_t tls_scratch_offset_ = 0;
  int tls_scratch_fd_ = -1;
  // HELLO, authentication and what the identity may read.
  PeerSession session_;

  FrameDecoder decoder_;
  const size_t receive_capacity_;
  // Outlives the connection's socket operations: freed with the connection.
  std::unique_ptr<char[]> receive_;
  size_t receive_begin_ = 0;  // unconsumed bytes: [begin, end)
  size_t receive_end_ = 0;
  bool reading_ = false;  // an async read is outstanding
  std::optional<SteadyClock::time_point> frame_started_;
  uint64_t bytes_since_frame_ = 0;

  std::deque<std::unique_ptr<Work>> queue_;  // at most max_in_flight + 1 (a closing ERROR)
  uint64_t next_seq_ = 0;
  size_t send_piece_ = 0;  // of the front reply: 0 header, k payload piece k - 1
  uint64_t send_offset_ = 0;
  uint64_t front_memory_sent_ = 0;
  bool write_waiting_ = false;
  bool budget_wait_registered_ = false;  // ReplyBudget will wake this connection

  SteadyClock::time_point accepted_at_;
  SteadyClock::time_point last_activity_;
  SteadyClock::time_point last_write_progress_;
  SteadyClock::time_point linger_deadline_;
  uint64_t linger_bytes_ = 0;
  uint64_t buffered_ = 0;  // last value given to NoteBuffered
};

}  // namespace granary::server_internal

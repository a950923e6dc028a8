#pragma once

// ReadService: what the cache node's TCP server (server.h) asks to answer a
// READ or a STAT. The server owns the sockets, the framing and the protocol
// policy; a ReadService knows what chunks and samples are. The daemon
// implements it over its chunk store (and on-demand staging from the source);
// tests implement it over plain files. The server never looks inside the
// answer beyond checking that it matches the request.
//
// How the server calls it: on its bounded service pool, never on an event-loop
// thread, so an implementation may block on disk or on the source. At most one
// call per connection is in progress at a time (a connection's requests are
// answered in order), so at most min(connections, pool threads) calls run at
// once, from any of the pool threads.
//
// Answers:
//  - Read fails as a whole (a non-OK Result) only when no item can be answered:
//    an unknown dataset or manifest is kNotFound. The server sends that Status
//    to the client as an ERROR for the request and keeps serving the connection.
//  - Otherwise every item gets an outcome, in request order, in a ReadAnswer:
//    OK with exactly the requested number of bytes (memory or a file range that
//    the server sends with sendfile(2)), or a per-item Status (docs/protocol.md,
//    "Per-item codes": kNotFound for a chunk not held here, kOutOfRange for an id
//    or range past the manifest, kCorruption, kFailedPrecondition, ...).
//  - An answer that does not match its request (wrong item count, an OK item of
//    the wrong length) is a bug: the server answers the request with an ERROR
//    kInternal, counts it, and keeps serving.
//
// Lifetime of payload bytes: the answer owns or holds (Hold) everything its
// pieces point into: memory it was given with AddBytes, and whatever keeps a
// file descriptor of AddFileRange open (e.g. the daemon's StoredChunkReader).
// The server keeps the answer until the reply has been written to the socket
// or the connection is gone, then destroys it on its event-loop thread.
//
// Thread safety: ReadService implementations must accept concurrent calls
// from several pool threads. A ReadAnswer is a value used by one thread at a
// time; the server moves it between threads without touching it concurrently.

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "granary/core/status.h"
#include "granary/protocol/protocol.h"

namespace granary {

// The answer to one READ: an outcome per item, in request order, and the OK
// items' payload pieces, in item order. Built item by item with the Add*
// methods; each call answers the next item.
class ReadAnswer {
 public:
  ReadAnswer() = default;
  ReadAnswer(ReadAnswer&&) noexcept = default;
  ReadAnswer& operator=(ReadAnswer&&) noexcept = default;
  ReadAnswer(const ReadAnswer&) = delete;
  ReadAnswer& operator=(const ReadAnswer&) = delete;
  ~ReadAnswer() = default;

  // The next item is OK; its bytes are `bytes`, owned by the answer.
  void AddBytes(std::string bytes, std::optional<uint64_t> checksum = std::nullopt) {
    owned_.push_back(std::make_unique<std::string>(std::move(bytes)));
    const PayloadPiece piece = std::string_view(*owned_.back());
    AddPieces(std::span(&piece, 1), checksum);
  }

  // The next item is OK; its bytes are `length` bytes of the open file `fd`
  // from `offset`, sent with sendfile(2). `fd` is borrowed: Hold() whatever
  // keeps it open. The server checks nothing about the file until it sends: a
  // file shorter than the range makes it close the connection mid-reply.
  void AddFileRange(int fd, uint64_t offset, uint32_t length,
                    std::optional<uint64_t> checksum = std::nullopt) {
    const PayloadPiece piece = FileRange{fd, offset, length};
    AddPieces(std::span(&piece, 1), checksum);
  }

  // The next item is OK; its bytes are the pieces in order (a sample that spans
  // two chunk files, or borrowed memory that something held keeps alive).
  // Empty pieces are skipped. Pieces adding up to more than a READ item can ask
  // for (4 GiB) make the item kInternal.
  void AddPieces(std::span<const PayloadPiece> pieces,
                 std::optional<uint64_t> checksum = std::nullopt) {
    uint64_t total = 0;
    for (const PayloadPiece& p : pieces) total += PieceSize(p);
    if (total > std::numeric_limits<uint32_t>::max()) {
      AddError(Status::Internal("the read service answered an item with " + std::to_string(total) +
                                " bytes, more than any item can ask for"));
      return;
    }
    for (const PayloadPiece& p : pieces) {
      if (PieceSize(p) == 0) continue;
      if (const auto* view = std::get_if<std::string_view>(&p)) memory_bytes_ += view->size();
      payload_.push_back(p);
    }
    reply_.items.push_back(ReadReplyItem{Status::Ok(), static_cast<uint32_t>(total), checksum});
  }

  // The next item failed with `status` (not OK: an OK status is recorded as
  // kInternal, a bug in the caller). No bytes are sent for it.
  void AddError(Status status) {
    if (status.ok()) status = Status::Internal("the read service failed an item without a reason");
    reply_.items.push_back(ReadReplyItem{std::move(status), 0, std::nullopt});
  }

  // Keeps `resource` alive as long as the answer: until the reply is sent or
  // the connection is gone.
  void Hold(std::shared_ptr<const void> resource) { held_.push_back(std::move(resource)); }

  const ReadReply& reply() const { return reply_; }
  const std::vector<PayloadPiece>& payload() const { return payload_; }
  size_t item_count() const { return reply_.items.size(); }
  // Bytes of memory the payload pieces point into (owned or borrowed). File
  // ranges are not memory. What the server counts as buffered for the
  // connection while the reply waits to be sent.
  uint64_t memory_bytes() const { return memory_bytes_; }

 private:
  ReadReply reply_;
  std::vector<PayloadPiece> payload_;
  // unique_ptr: a string_view into a moved std::string would dangle (SSO).
  std::vector<std::unique_ptr<std::string>> owned_;
  std::vector<std::shared_ptr<const void>> held_;
  uint64_t memory_bytes_ = 0;
};

class ReadService {
 public:
  virtual ~ReadService() = default;

  // Answers one decoded READ (the codec has checked its shape and limits; the
  // service checks ids and ranges against the manifest). See "Answers" above.
  virtual Result<ReadAnswer> Read(const ReadRequest& request) = 0;

  // Answers STAT: of the whole node when request.dataset is empty, else of
  // that dataset (kNotFound if it is not served here). At most
  // protocol_format::kMaxStatEntries entries with unique [a-z0-9_] keys. For
  // the node-wide STAT the server appends its own counters (keys starting
  // "server_") after the service's, and reports kDraining while it stops.
  virtual Result<StatReply> Stat(const StatRequest& request) = 0;
};

}  // namespace granary

// Chunk handoff codec and client (chunk_handoff.h; docs/protocol.md, "Chunk
// handoff").

#include "granary/core/chunk_handoff.h"

#include <poll.h>

#include <array>
#include <cstring>
#include <vector>

#include "granary/core/byte_order.h"
#include "granary/core/names.h"
#include "granary/core/unix_socket.h"

namespace granary::handoff {
namespace {

std::string Frame(MessageType type, std::string_view body) {
  std::string out;
  out.reserve(kHeaderSize + body.size());
  ByteWriter w(&out);
  w.PutBytes(std::string_view(kMagic, sizeof(kMagic)));
  w.Put(kVersion);
  w.Put(static_cast<uint16_t>(type));
  w.Put(static_cast<uint32_t>(body.size()));
  w.PutBytes(body);
  return out;
}

Status CheckDataset(std::string_view name, std::string_view doing) {
  if (IsDnsLabel(name)) return Status::Ok();
  return Status::InvalidArgument(std::string(doing) + ": dataset name " + Quoted(name) +
                                 " is not a DNS-1123 label (lower-case letters, digits and "
                                 "'-', at most 63)");
}

}  // namespace

Result<Header> DecodeHeader(std::string_view bytes) {
  if (bytes.size() != kHeaderSize) {
    return Status::InvalidArgument("chunk handoff frame header: " + std::to_string(bytes.size()) +
                                   " bytes where " + std::to_string(kHeaderSize) +
                                   " were expected");
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return Status::InvalidArgument(
        "chunk handoff frame header: bad magic (not a Granary chunk handoff peer; is this the "
        "cache node's local_socket?)");
  }
  ByteReader r(bytes.substr(sizeof(kMagic)));
  uint16_t version = 0;
  uint16_t type = 0;
  uint32_t body = 0;
  r.Get(&version);
  r.Get(&type);
  r.Get(&body);
  if (version != kVersion) {
    return Status::VersionMismatch("chunk handoff frame: version " + std::to_string(version) +
                                   " where this build speaks " + std::to_string(kVersion) +
                                   "; run the same Granary version on the cache node and sidecar");
  }
  if (type != static_cast<uint16_t>(MessageType::kOpenChunk) &&
      type != static_cast<uint16_t>(MessageType::kOpenChunkReply)) {
    return Status::InvalidArgument("chunk handoff frame: unknown message type " +
                                   std::to_string(type));
  }
  if (body > kMaxBodySize) {
    return Status::InvalidArgument("chunk handoff frame: body of " + std::to_string(body) +
                                   " bytes is over the limit of " + std::to_string(kMaxBodySize));
  }
  return Header{static_cast<MessageType>(type), body};
}

Result<std::string> EncodeOpenChunk(const OpenChunkRequest& request) {
  GRANARY_RETURN_IF_ERROR(CheckDataset(request.dataset, "encoding OPEN_CHUNK"));
  std::string body;
  ByteWriter w(&body);
  w.Put(static_cast<uint8_t>(request.dataset.size()));
  w.PutBytes(request.dataset);
  const std::array<uint8_t, 16> id = request.manifest_id.ToBytes();
  w.PutBytes(std::string_view(reinterpret_cast<const char*>(id.data()), id.size()));
  w.Put(request.chunk);
  return Frame(MessageType::kOpenChunk, body);
}

Result<OpenChunkRequest> DecodeOpenChunk(std::string_view body) {
  ByteReader r(body);
  uint8_t length = 0;
  std::string_view name;
  std::string_view id;
  OpenChunkRequest request;
  r.Get(&length);
  r.GetBytes(length, &name);
  r.GetBytes(16, &id);
  r.Get(&request.chunk);
  if (!r.ok()) {
    return Status::InvalidArgument("OPEN_CHUNK: body of " + std::to_string(body.size()) +
                                   " bytes is too short for its fields");
  }
  if (r.remaining() != 0) {
    return Status::InvalidArgument("OPEN_CHUNK: " + std::to_string(r.remaining()) +
                                   " bytes after the last field");
  }
  GRANARY_RETURN_IF_ERROR(CheckDataset(name, "OPEN_CHUNK"));
  request.dataset = std::string(name);
  request.manifest_id = ContentId::FromBytes(reinterpret_cast<const uint8_t*>(id.data()));
  return request;
}

std::string EncodeReply(const Status& status) {
  const std::string_view message = std::string_view(status.message()).substr(0, kMaxMessageLength);
  std::string body;
  ByteWriter w(&body);
  w.Put(static_cast<uint32_t>(status.code()));
  w.Put(static_cast<uint16_t>(message.size()));
  w.PutBytes(message);
  return Frame(MessageType::kOpenChunkReply, body);
}

Status DecodeReply(std::string_view body, Status* carried) {
  ByteReader r(body);
  uint32_t code = 0;
  uint16_t length = 0;
  std::string_view message;
  r.Get(&code);
  r.Get(&length);
  r.GetBytes(length, &message);
  if (!r.ok() || r.remaining() != 0) {
    return Status::InvalidArgument("OPEN_CHUNK_REPLY: body of " + std::to_string(body.size()) +
                                   " bytes does not match its fields");
  }
  if (code > static_cast<uint32_t>(StatusCode::kInternal) || length > kMaxMessageLength) {
    return Status::InvalidArgument("OPEN_CHUNK_REPLY: status code " + std::to_string(code) +
                                   " or message length " + std::to_string(length) +
                                   " out of range");
  }
  *carried = code == 0 ? Status::Ok() : Status(static_cast<StatusCode>(code), std::string(message));
  return Status::Ok();
}

// ---- client -------------------------------------------------------------------------

Result<ScopedFd> ChunkHandoffClient::OpenChunk(const OpenChunkRequest& request) {
  GRANARY_ASSIGN_OR_RETURN(std::string frame, EncodeOpenChunk(request));
  std::lock_guard<std::mutex> lock(mu_);
  Result<ScopedFd> got = Exchange(frame);
  if (!got.ok()) {
    const StatusCode code = got.status().code();
    // The node's own answers keep the connection; transport failures drop it.
    if (code == StatusCode::kUnavailable || code == StatusCode::kDeadlineExceeded ||
        code == StatusCode::kIoError || code == StatusCode::kVersionMismatch) {
      fd_.Reset();
    }
  }
  return got;
}

Result<ScopedFd> ChunkHandoffClient::Exchange(const std::string& frame) {
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  const std::string what = "the cache node's handoff socket " + Quoted(path_);
  if (!fd_.valid()) {
    Result<ScopedFd> connected = ConnectUnix(path_, timeout_);
    if (!connected.ok()) return connected.status();
    fd_ = std::move(*connected);
  }
  std::string_view rest = frame;
  for (int round = 0; !rest.empty(); ++round) {
    if (round >= kMaxPollRounds) return Status::Internal("sending to " + what + ": no progress");
    GRANARY_ASSIGN_OR_RETURN(bool ready, WaitFdReady(fd_.get(), POLLOUT, deadline, what));
    if (!ready) return Status::DeadlineExceeded("sending to " + what + ": timed out");
    Result<size_t> sent = SendWithFds(fd_.get(), rest);
    if (!sent.ok()) {
      if (sent.status().code() == StatusCode::kUnavailable) continue;
      return Status(StatusCode::kIoError, "sending to " + what + ": " + sent.status().message());
    }
    rest.remove_prefix(*sent);
  }

  std::string in;
  std::vector<ScopedFd> fds;
  size_t want = kHeaderSize;
  Header header;
  bool have_header = false;
  char buffer[kHeaderSize + kMaxBodySize];
  for (int round = 0; in.size() < want; ++round) {
    if (round >= kMaxPollRounds) return Status::Internal("reading from " + what + ": no progress");
    GRANARY_ASSIGN_OR_RETURN(bool ready, WaitFdReady(fd_.get(), POLLIN, deadline, what));
    if (!ready) return Status::DeadlineExceeded("waiting for " + what + ": timed out");
    Result<size_t> got = ReceiveWithFds(fd_.get(), std::span<char>(buffer, want - in.size()), &fds);
    if (!got.ok()) {
      if (got.status().code() == StatusCode::kUnavailable) continue;
      return Status(StatusCode::kIoError, "reading from " + what + ": " + got.status().message());
    }
    if (*got == 0) return Status::Unavailable(what + " closed the connection mid-reply");
    in.append(buffer, *got);
    if (!have_header && in.size() >= kHeaderSize) {
      Result<Header> h = DecodeHeader(std::string_view(in).substr(0, kHeaderSize));
      if (!h.ok()) {
        // The stream is out of step (or another version): the connection goes.
        const StatusCode code = h.status().code() == StatusCode::kVersionMismatch
                                    ? StatusCode::kVersionMismatch
                                    : StatusCode::kIoError;
        return Status(code, "from " + what + ": " + h.status().message());
      }
      if (h->type != MessageType::kOpenChunkReply) {
        return Status(StatusCode::kIoError, "from " + what + ": not an OPEN_CHUNK_REPLY");
      }
      header = *h;
      have_header = true;
      want = kHeaderSize + header.body_size;
    }
  }
  Status answer;
  if (Status decoded = DecodeReply(std::string_view(in).substr(kHeaderSize), &answer);
      !decoded.ok()) {
    return Status(StatusCode::kIoError, "from " + what + ": " + decoded.message());
  }
  if (!answer.ok()) return answer;
  if (fds.size() != 1) {
    return Status(StatusCode::kIoError, "from " + what + ": an OK reply with " +
                                            std::to_string(fds.size()) +
                                            " descriptors where 1 was expected");
  }
  return std::move(fds.front());
}

}  // namespace granary::handoff

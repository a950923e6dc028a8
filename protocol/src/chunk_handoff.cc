// Chunk handoff codec and client (chunk_handoff.h; byte layout in
// chunk_handoff_format.h; docs/protocol.md, "Chunk handoff"). Frames go
// through the shared frame layer (wire_frame.h).

#include "granary/protocol/chunk_handoff.h"

#include <poll.h>

#include <array>
#include <cstring>
#include <vector>

#include "granary/core/byte_order.h"
#include "granary/core/names.h"
#include "granary/protocol/unix_socket.h"
#include "granary/protocol/wire_frame.h"

namespace granary::handoff {
namespace {

namespace hf = chunk_handoff_format;

std::string Describe(const wire::WireHeader& h) {
  std::string_view name;
  if (h.type == hf::kTypeOpenChunk) name = "OPEN_CHUNK";
  if (h.type == hf::kTypeOpenChunkReply) name = "OPEN_CHUNK_REPLY";
  return wire::DescribeFrame(name, h.type, /*hex_types=*/false, /*has_request_id=*/false, 0);
}

// GRHO: the shared header without flags, payload or request id.
const wire::FrameFormat kFrameFormat = {
    .magic = {hf::kMagic[0], hf::kMagic[1], hf::kMagic[2], hf::kMagic[3]},
    .has_flags = false,
    .has_payload_length = false,
    .has_request_id = false,
    .frame_noun = "chunk handoff frame",
    .bad_magic_advice = "not a Granary chunk handoff peer; is this the cache node's local_socket?",
    .connection_noun = "chunk handoff connection",
    .describe = &Describe,
};

// The header rules: this version, a known type, a body within kMaxBodySize.
Status CheckHeader(const wire::WireHeader& h) {
  if (h.version != kVersion) {
    return Status::VersionMismatch("chunk handoff frame: version " + std::to_string(h.version) +
                                   " where this build speaks " + std::to_string(kVersion) +
                                   "; run the same Granary version on the cache node and sidecar");
  }
  if (h.type != hf::kTypeOpenChunk && h.type != hf::kTypeOpenChunkReply) {
    return Status::InvalidArgument("chunk handoff frame: unknown message type " +
                                   std::to_string(h.type));
  }
  if (h.body_length > kMaxBodySize) {
    return Status::InvalidArgument("chunk handoff frame: body of " + std::to_string(h.body_length) +
                                   " bytes is over the limit of " + std::to_string(kMaxBodySize));
  }
  return Status::Ok();
}

std::string Frame(MessageType type, std::string_view body) {
  return wire::EncodeFrame(
      kFrameFormat, wire::WireHeader{.version = kVersion, .type = static_cast<uint16_t>(type)},
      body);
}

Status CheckDataset(std::string_view name, std::string_view doing) {
  if (IsDnsLabel(name)) return Status::Ok();
  return Status::InvalidArgument(std::string(doing) + ": dataset name " + Quoted(name) +
                                 " is not a DNS-1123 label (lower-case letters, digits and "
                                 "'-', at most 63)");
}

}  // namespace

Result<Header> DecodeHeader(std::string_view bytes) {
  GRANARY_ASSIGN_OR_RETURN(wire::WireHeader h, wire::ParseHeader(kFrameFormat, bytes));
  GRANARY_RETURN_IF_ERROR(CheckHeader(h));
  return Header{static_cast<MessageType>(h.type), h.body_length};
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
  r.GetBytes(hf::kManifestIdSize, &id);
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
  const std::string_view message = wire::Cut(status.message(), kMaxMessageLength);
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

  // Exactly one reply: the reader is asked how many bytes the frame still
  // needs, so nothing past it is read.
  wire::FrameReader reader(kFrameFormat);
  auto check_reply = [](const wire::WireHeader& h) -> Status {
    GRANARY_RETURN_IF_ERROR(CheckHeader(h));
    if (h.type != hf::kTypeOpenChunkReply) {
      return Status::InvalidArgument("not an OPEN_CHUNK_REPLY but a " + Describe(h));
    }
    return Status::Ok();
  };
  std::vector<ScopedFd> fds;
  char buffer[kHeaderSize + kMaxBodySize];
  for (int round = 0; !reader.has_frame(); ++round) {
    if (round >= kMaxPollRounds) return Status::Internal("reading from " + what + ": no progress");
    GRANARY_ASSIGN_OR_RETURN(bool ready, WaitFdReady(fd_.get(), POLLIN, deadline, what));
    if (!ready) return Status::DeadlineExceeded("waiting for " + what + ": timed out");
    Result<size_t> got = ReceiveWithFds(fd_.get(), std::span<char>(buffer, reader.wanted()), &fds);
    if (!got.ok()) {
      if (got.status().code() == StatusCode::kUnavailable) continue;
      return Status(StatusCode::kIoError, "reading from " + what + ": " + got.status().message());
    }
    if (*got == 0) return Status::Unavailable(what + " closed the connection mid-reply");
    Result<size_t> used = reader.Feed(std::string_view(buffer, *got), check_reply);
    if (!used.ok()) {
      // The stream is out of step (or another version): the connection goes.
      const StatusCode code = used.status().code() == StatusCode::kVersionMismatch
                                  ? StatusCode::kVersionMismatch
                                  : StatusCode::kIoError;
      return Status(code, "from " + what + ": " + used.status().message());
    }
  }
  const wire::WireFrame reply = reader.TakeFrame();
  Status answer;
  if (Status decoded = DecodeReply(reply.body, &answer); !decoded.ok()) {
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

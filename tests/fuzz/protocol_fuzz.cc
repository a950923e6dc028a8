// libFuzzer target for the cache node's wire protocol (protocol/src/protocol.cc):
// the input is a byte stream as a peer would send it, fed to a FrameDecoder
// in pieces, every frame decoded as a request or a response, and every decoded
// message re-encoded. Any crash, sanitizer report, huge allocation, hang or
// broken invariant below is a finding.
//
// Input: byte 0 is a mode, the rest is the stream.
//   bit 0  responses (client side) instead of requests (server side)
//   bit 1  tight limits (so the limit paths are reached with small inputs)
//   bit 2  detached payloads (the caller takes READ_REPLY payloads itself)
//   bits 3-7  seed of the split pattern
// Seeds: tests/fuzz/corpus/protocol, written by protocol_test's SeedCorpus test.
//
// Invariants:
//  - errors are only kInvalidArgument, kOutOfRange or kVersionMismatch;
//  - the decoder never holds more than the limits allow, whatever the splits;
//  - splitting the stream differently gives the same frames and the same error;
//  - a decoded message re-encodes, and the encoding is canonical: the same
//    frame comes back (unless a status code unknown to this build was mapped
//    to kInternal, which changes the message by design).

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "granary/core/byte_order.h"
#include "granary/protocol/protocol.h"
#include "granary/protocol/protocol_format.h"

namespace granary {
namespace {

namespace pf = protocol_format;

void Check(bool condition, const char* what, const Status& status = Status::Ok()) {
  if (condition) return;
  std::fprintf(stderr, "protocol_fuzz invariant broken: %s (%s)\n", what,
               status.ToString().c_str());
  std::abort();
}

bool AllowedError(const Status& s) {
  return s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kOutOfRange ||
         s.code() == StatusCode::kVersionMismatch;
}

struct Outcome {
  std::vector<Frame> frames;  // with detached payloads appended by the "caller"
  Status end;                 // the Feed error, or Finish()

  friend bool operator==(const Outcome&, const Outcome&) = default;
};

// Feeds `stream` in pieces of 1..max_piece bytes (a simple LCG picks them);
// max_piece 0 means all at once.
Outcome Run(std::string_view stream, FrameDirection direction, const ProtocolLimits& limits,
            PayloadMode mode, uint32_t seed, size_t max_piece) {
  Outcome out;
  FrameDecoder decoder(direction, limits, mode);
  const uint64_t bound = pf::kFrameHeaderSize + uint64_t{limits.max_body_bytes} +
                         limits.max_read_bytes + 2 * 32;  // + two empty strings' inline capacity
  uint32_t state = seed * 2654435761u + 1;
  // Each round consumes at least one byte or takes a frame; frames are at least
  // 32 bytes, so 2 rounds per byte bound the loop.
  const size_t max_rounds = 2 * stream.size() + 4;
  for (size_t rounds = 0; !stream.empty() && rounds < max_rounds; ++rounds) {
    size_t n = stream.size();
    if (max_piece > 0) {
      state = state * 1664525u + 1013904223u;
      n = std::min(n, 1 + (state >> 8) % max_piece);
    }
    std::string_view piece = stream.substr(0, n);
    if (decoder.payload_remaining() > 0) {
      uint64_t used = decoder.ConsumePayload(piece.size());
      Check(used > 0 && used <= piece.size(), "ConsumePayload takes what is offered");
      out.frames.back().payload.append(piece.substr(0, used));
      stream.remove_prefix(used);
      continue;
    }
    Result<size_t> used = decoder.Feed(piece);
    if (!used.ok()) {
      Check(AllowedError(used.status()), "Feed fails only with the documented codes",
            used.status());
      Check(decoder.status() == used.status(), "the error is sticky");
      out.end = used.status();
      return out;
    }
    Check(*used <= piece.size(), "Feed consumes at most what it is given");
    Check(decoder.buffered_bytes() <= bound, "the decoder holds no more than the limits");
    stream.remove_prefix(*used);
    if (decoder.has_frame()) {
      Frame f = decoder.TakeFrame();
      Check(f.body.size() == f.header.body_length, "a frame holds its body");
      Check(f.body.size() <= limits.max_body_bytes, "bodies within the limit");
      Check(f.header.payload_length <= limits.max_read_bytes, "payloads within the limit");
      Check(mode == PayloadMode::kDetached ? f.payload.empty()
                                           : f.payload.size() == f.header.payload_length,
            "payload buffered or detached as asked");
      out.frames.push_back(std::move(f));
    } else {
      Check(*used == piece.size(), "without a frame, Feed consumes everything");
    }
  }
  Check(stream.empty(), "the loop bound was enough");
  out.end = decoder.Finish();
  Check(out.end.ok() || AllowedError(out.end), "Finish fails only with the documented codes",
        out.end);
  return out;
}

bool HasUnknownStatus(const Frame& f) {
  if (f.header.type == pf::kTypeError && f.body.size() >= pf::kErrorFixedSize) {
    return LoadLe<uint16_t>(f.body.data() + pf::kErrorStatusOffset) > pf::kWireMaxKnown;
  }
  if (f.header.type == pf::kTypeReadReply && f.body.size() >= pf::kReadReplyFixedSize) {
    uint32_t count = LoadLe<uint32_t>(f.body.data() + pf::kReadReplyItemCountOffset);
    for (uint64_t i = 0; i < count; ++i) {
      uint64_t at = pf::kReadReplyFixedSize + i * pf::kReplyItemSize;
      if (at + pf::kReplyItemSize > f.body.size()) break;
      if (LoadLe<uint16_t>(f.body.data() + at) > pf::kWireMaxKnown) return true;
    }
  }
  return false;
}

void CheckReencodes(const Frame& f, FrameDirection direction, const ProtocolLimits& limits) {
  // A detached payload cut by the end of the stream: not a whole message.
  if (f.payload.size() != f.header.payload_length) return;
  EncodeOptions options{f.header.version, limits};
  Result<Frame> again = Status::Internal("not encoded");
  if (direction == FrameDirection::kRequests) {
    Result<RequestMessage> m = DecodeRequest(f, limits);
    if (!m.ok()) {
      Check(AllowedError(m.status()), "DecodeRequest fails only with the documented codes",
            m.status());
      return;
    }
    Result<std::string> bytes = EncodeRequest(f.header.request_id, *m, options);
    Check(bytes.ok(), "a decoded request re-encodes", bytes.status());
    again = DecodeFrame(*bytes, direction, limits);
    Check(again.ok(), "a re-encoded request decodes", again.status());
    Result<RequestMessage> m2 = DecodeRequest(*again, limits);
    Check(m2.ok() && *m2 == *m, "decode(encode(request)) is the request", m2.status());
  } else {
    Result<ResponseMessage> m = DecodeResponse(f, limits);
    if (!m.ok()) {
      Check(AllowedError(m.status()), "DecodeResponse fails only with the documented codes",
            m.status());
      return;
    }
    std::vector<PayloadPiece> payload;
    if (!f.payload.empty()) payload.push_back(std::string_view(f.payload));
    Result<OutgoingFrame> out = EncodeResponse(f.header.request_id, *m, payload, options);
    Check(out.ok(), "a decoded response re-encodes", out.status());
    Result<std::string> bytes = Flatten(*out);
    Check(bytes.ok(), "flatten", bytes.status());
    again = DecodeFrame(*bytes, direction, limits);
    Check(again.ok(), "a re-encoded response decodes", again.status());
    Result<ResponseMessage> m2 = DecodeResponse(*again, limits);
    Check(m2.ok(), "a re-encoded response decodes as a message", m2.status());
    if (!HasUnknownStatus(f)) Check(*m2 == *m, "decode(encode(response)) is the response");
  }
  if (!HasUnknownStatus(f)) Check(*again == f, "the encoding is canonical");
}

}  // namespace
}  // namespace granary

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace granary;
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  std::string_view stream(reinterpret_cast<const char*>(data + 1), size - 1);
  FrameDirection direction =
      (mode & 1) != 0 ? FrameDirection::kResponses : FrameDirection::kRequests;
  ProtocolLimits limits;
  if ((mode & 2) != 0) {
    limits.max_items = 16;
    limits.max_body_bytes = protocol_format::kMinBodyBytes;
    limits.max_read_bytes = 4096;
    limits.max_message_bytes = protocol_format::kFrameHeaderSize + limits.max_body_bytes + 1000;
  }
  Check(limits.Validate().ok(), "fuzzer limits are valid", limits.Validate());
  PayloadMode payload_mode = (mode & 4) != 0 ? PayloadMode::kDetached : PayloadMode::kBuffered;
  uint32_t seed = mode >> 3;

  Outcome whole = Run(stream, direction, limits, payload_mode, seed, 0);
  Outcome split = Run(stream, direction, limits, payload_mode, seed, 1 + seed % 64);
  Check(split == whole, "the same frames and error whatever the splits", split.end);
  if (seed % 4 == 0) {
    Outcome bytewise = Run(stream, direction, limits, payload_mode, seed, 1);
    Check(bytewise == whole, "the same frames fed byte by byte", bytewise.end);
  }
  for (const Frame& f : whole.frames) CheckReencodes(f, direction, limits);

  // DecodeFrame on the whole stream agrees with the decoder.
  Result<Frame> one = DecodeFrame(stream, direction, limits);
  if (one.ok()) {
    Check(whole.frames.size() == 1 && whole.end.ok(), "DecodeFrame: exactly one frame");
    if (payload_mode == PayloadMode::kBuffered) Check(*one == whole.frames[0], "same frame");
  } else {
    Check(AllowedError(one.status()), "DecodeFrame fails only with the documented codes",
          one.status());
  }
  return 0;
}

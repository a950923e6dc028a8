// libFuzzer target for the sidecar's local protocol (protocol/src/sidecar_protocol.cc):
// the input is a byte stream as a client (or a sidecar) would send it, fed to a
// FrameDecoder in pieces; every frame is decoded both as a request and as a
// reply, and every decoded message re-encoded. Any crash, sanitizer report,
// huge allocation, hang or broken invariant below is a finding.
//
// Input: byte 0 is a mode, the rest is the stream.
//   bit 0     tight limits (4096-byte bodies, 16 items), so the limit paths are
//             reached with small inputs
//   bits 1-7  seed of the split pattern
// Seeds: tests/fuzz/corpus/sidecar_protocol, written by sidecar_protocol_test's
// SeedCorpus test.
//
// Invariants:
//  - errors are only kInvalidArgument, kOutOfRange or kVersionMismatch;
//  - the decoder never holds more than a header and max_body_bytes;
//  - splitting the stream differently gives the same frames and the same error;
//  - a decoded message re-encodes under the same limits and version, and the
//    encoding is canonical: the same frame comes back (unless a status code
//    unknown to this build was mapped to kInternal, which changes the message
//    by design);
//  - EncodeError of any bytes as a message decodes to that message, cut.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "granary/protocol/sidecar_protocol.h"

namespace granary::sidecar_protocol {
namespace {

void Check(bool condition, const char* what, const Status& status = Status::Ok()) {
  if (condition) return;
  std::fprintf(stderr, "sidecar_protocol_fuzz invariant broken: %s (%s)\n", what,
               status.ToString().c_str());
  std::abort();
}

bool AllowedError(const Status& s) {
  return s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kOutOfRange ||
         s.code() == StatusCode::kVersionMismatch;
}

struct Outcome {
  std::vector<Frame> frames;
  Status end;  // the Feed error, or Finish()

  friend bool operator==(const Outcome&, const Outcome&) = default;
};

// Feeds `stream` in pieces of 1..max_piece bytes (a simple LCG picks them);
// max_piece 0 means all at once.
Outcome Run(std::string_view stream, const Limits& limits, uint32_t seed, size_t max_piece) {
  Outcome out;
  FrameDecoder decoder(limits);
  // + the inline capacity of an empty string.
  const size_t bound = kFrameHeaderSize + size_t{limits.max_body_bytes} + 32;
  uint32_t state = seed * 2654435761u + 1;
  // Each round consumes at least one byte or takes a frame; frames are at least
  // 24 bytes, so 2 rounds per byte bound the loop.
  const size_t max_rounds = 2 * stream.size() + 4;
  for (size_t rounds = 0; !stream.empty() && rounds < max_rounds; ++rounds) {
    size_t n = stream.size();
    if (max_piece > 0) {
      state = state * 1664525u + 1013904223u;
      n = std::min(n, 1 + (state >> 8) % max_piece);
    }
    std::string_view piece = stream.substr(0, n);
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

bool IsUnknownStatus(const Status& s) {
  return s.code() == StatusCode::kInternal && s.message().starts_with("sidecar sent status code ");
}

bool HasUnknownStatus(const Reply& reply) {
  if (const auto* e = std::get_if<Error>(&reply)) return IsUnknownStatus(e->status);
  if (const auto* s = std::get_if<Samples>(&reply)) {
    for (const SampleItem& item : s->items) {
      if (IsUnknownStatus(item.status)) return true;
    }
  }
  if (const auto* l = std::get_if<LookupReply>(&reply)) {
    for (const LookupItem& item : l->items) {
      if (IsUnknownStatus(item.status)) return true;
    }
  }
  return false;
}

void CheckRequestReencodes(const Frame& f, const Limits& limits) {
  Result<Request> m = DecodeRequest(f, limits);
  if (!m.ok()) {
    Check(AllowedError(m.status()), "DecodeRequest fails only with the documented codes",
          m.status());
    return;
  }
  Result<std::string> bytes = EncodeRequest(f.header.request_id, *m, limits, f.header.version);
  Check(bytes.ok(), "a decoded request re-encodes", bytes.status());
  Result<Frame> again = DecodeFrame(*bytes, limits);
  Check(again.ok(), "a re-encoded request is a frame", again.status());
  Check(*again == f, "the request encoding is canonical");
  Result<Request> m2 = DecodeRequest(*again, limits);
  Check(m2.ok() && *m2 == *m, "decode(encode(request)) is the request", m2.status());
}

void CheckReplyReencodes(const Frame& f, const Limits& limits) {
  Result<Reply> m = DecodeReply(f, limits);
  if (!m.ok()) {
    Check(AllowedError(m.status()), "DecodeReply fails only with the documented codes", m.status());
    return;
  }
  Result<std::string> bytes = EncodeReply(f.header.request_id, *m, limits, f.header.version);
  Check(bytes.ok(), "a decoded reply re-encodes", bytes.status());
  Result<Frame> again = DecodeFrame(*bytes, limits);
  Check(again.ok(), "a re-encoded reply is a frame", again.status());
  Result<Reply> m2 = DecodeReply(*again, limits);
  Check(m2.ok(), "a re-encoded reply decodes", m2.status());
  if (!HasUnknownStatus(*m)) {
    Check(*again == f, "the reply encoding is canonical");
    Check(*m2 == *m, "decode(encode(reply)) is the reply");
  }
}

void CheckEncodeError(const Frame& f) {
  const bool closing = (f.header.request_id & 1) != 0;
  std::string bytes =
      EncodeError(f.header.request_id, Status::NotFound(f.body), closing, f.header.version);
  Result<Frame> frame = DecodeFrame(bytes);
  Check(frame.ok(), "EncodeError is a frame", frame.status());
  Result<Reply> back = DecodeReply(*frame);
  Check(back.ok(), "EncodeError decodes", back.status());
  const auto* e = std::get_if<Error>(&*back);
  Check(e != nullptr && e->closing == closing && e->status.code() == StatusCode::kNotFound &&
            e->status.message() == f.body.substr(0, std::min(f.body.size(), kMaxMessageLength)),
        "EncodeError carries the status, cut");
}

}  // namespace
}  // namespace granary::sidecar_protocol

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace granary;
  using namespace granary::sidecar_protocol;
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  std::string_view stream(reinterpret_cast<const char*>(data + 1), size - 1);
  Limits limits;
  if ((mode & 1) != 0) limits = Limits{4096, 16};
  Check(limits.Validate().ok(), "fuzzer limits are valid", limits.Validate());
  const uint32_t seed = mode >> 1;

  Outcome whole = Run(stream, limits, seed, 0);
  Outcome split = Run(stream, limits, seed, 1 + seed % 64);
  Check(split == whole, "the same frames and error whatever the splits", split.end);
  if (seed % 8 == 0) {
    Outcome bytewise = Run(stream, limits, seed, 1);
    Check(bytewise == whole, "the same frames fed byte by byte", bytewise.end);
  }
  for (const Frame& f : whole.frames) {
    CheckRequestReencodes(f, limits);
    CheckReplyReencodes(f, limits);
    CheckEncodeError(f);
  }

  // DecodeFrame on the whole stream agrees with the decoder.
  Result<Frame> one = DecodeFrame(stream, limits);
  if (one.ok()) {
    Check(whole.frames.size() == 1 && whole.end.ok() && *one == whole.frames[0],
          "DecodeFrame: exactly the one frame");
  } else {
    Check(AllowedError(one.status()), "DecodeFrame fails only with the documented codes",
          one.status());
  }
  return 0;
}

#pragma once

// The frame layer that every Granary protocol shares: the cache node's wire
// protocol (protocol.h), the sidecar's local protocol (sidecar_protocol.h) and
// the chunk handoff (chunk_handoff.h). A frame is a fixed header, then a body,
// then (cache protocol READ_REPLY only) a payload. The three headers differ
// only in which optional fields they carry, always in this order:
//
//   magic     4 bytes   the protocol's ("GRNW", "GRSC", "GRHO")
//   version   u16
//   type      u16
//   [flags          u32]  cache and sidecar protocols
//   body_length     u32
//   [payload_length u64]  cache protocol
//   [request_id     u64]  cache and sidecar protocols
//
// A FrameFormat is a protocol's choice of fields and how its errors name a
// frame. This file encodes and parses such headers and splits a byte stream
// into frames (FrameReader). What a protocol accepts in a header (versions,
// types, flags, limits) and in a body stays with the protocol: FrameReader
// asks it through a check callback before it buffers a byte of the body.
// docs/protocol.md, "Frames shared by every protocol", says where a new
// protocol or message plugs in.
//
// Thread safety: FrameFormat values are constants and the free functions are
// pure. A FrameReader belongs to one connection and one thread at a time.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "granary/core/byte_order.h"
#include "granary/core/status.h"

namespace granary::wire {

// A fixed header, decoded. Fields a format does not carry are 0.
struct WireHeader {
  uint16_t version = 0;
  uint16_t type = 0;
  uint32_t flags = 0;
  uint32_t body_length = 0;
  uint64_t payload_length = 0;
  uint64_t request_id = 0;

  friend bool operator==(const WireHeader&, const WireHeader&) = default;
};

// One protocol's frame header and the words its errors use.
struct FrameFormat {
  std::array<char, 4> magic;
  bool has_flags = false;
  bool has_payload_length = false;
  bool has_request_id = false;
  // "frame", "sidecar frame": in "read <frame_noun> header: bad magic ...".
  std::string_view frame_noun;
  // After a bad magic: who the peer might be and what to do.
  std::string_view bad_magic_advice;
  // In "<connection_noun> closed mid-frame: ...".
  std::string_view connection_noun;
  // Names a frame in errors: "READ frame (request id 7)" (see DescribeFrame).
  std::string (*describe)(const WireHeader& header) = nullptr;

  constexpr size_t header_size() const {
    return size_t{12} + (has_flags ? 4u : 0u) + (has_payload_length ? 8u : 0u) +
           (has_request_id ? 8u : 0u);
  }
  // Offsets of the fields after the type.
  constexpr size_t flags_offset() const { return 8; }
  constexpr size_t body_length_offset() const { return has_flags ? 12u : 8u; }
  constexpr size_t payload_length_offset() const { return body_length_offset() + 4u; }
  constexpr size_t request_id_offset() const {
    return payload_length_offset() + (has_payload_length ? 8u : 0u);
  }
};
inline constexpr size_t kMagicOffset = 0;
inline constexpr size_t kVersionOffset = 4;
inline constexpr size_t kTypeOffset = 6;

// "READ frame (request id 7)"; for a type the protocol does not know (empty
// `type_name`), "frame of type 0x1234 (request id 7)" (decimal unless
// `hex_types`). Without a request id field: "READ frame".
std::string DescribeFrame(std::string_view type_name, uint16_t type, bool hex_types,
                          bool has_request_id, uint64_t request_id);

// Small pieces of the protocols' error texts and messages.
std::string Hex16(uint16_t v);                         // "0x00ff"
std::string VersionRange(uint16_t min, uint16_t max);  // "1..2"
// The first `max` bytes of `s` (messages are cut, never refused).
inline std::string_view Cut(std::string_view s, size_t max) { return s.substr(0, max); }

// The header's bytes. The fields the format does not carry are not written
// (and must be 0).
void PutHeader(const FrameFormat& format, const WireHeader& header, ByteWriter* out);

// A whole frame: the header (body_length set to body.size()), then the body.
// The payload, if any, is the caller's to send after it.
std::string EncodeFrame(const FrameFormat& format, WireHeader header, std::string_view body);

// The header in `bytes` (exactly format.header_size() of them). Checks only
// the magic: kInvalidArgument for a wrong size or magic. The protocol checks
// the rest.
Result<WireHeader> ParseHeader(const FrameFormat& format, std::string_view bytes);

// A complete frame as a FrameReader delivers it.
struct WireFrame {
  WireHeader header;
  std::string body;     // body_length bytes
  std::string payload;  // payload_length bytes, or empty when detached

  friend bool operator==(const WireFrame&, const WireFrame&) = default;
};

// Splits a byte stream into frames. Feed it bytes as they arrive, split
// anywhere; it holds at most one frame and grows its buffers only as bytes
// actually arrive (a header announcing a large body costs nothing until the
// body comes). Every header passes the protocol's check before any of its
// body is buffered, so the check's limits bound what the reader holds. After
// an error (a bad magic, a failed check, Fail) it stays failed: the stream
// has lost its place; close the connection.
class FrameReader {
 public:
  enum class Payload {
    kBuffered,  // the frame holds its payload
    kDetached,  // the frame is ready after its body; the caller takes the
                // payload bytes from the stream itself (ConsumePayload)
  };

  explicit FrameReader(const FrameFormat& format, Payload payload = Payload::kBuffered)
      : format_(&format), payload_mode_(payload) {}

  // Consumes bytes from the front of `data` until a frame is complete or the
  // bytes run out; returns how many. While a frame waits to be taken, or a
  // detached payload is outstanding, it consumes nothing. `check` is a
  // callable `Status(const WireHeader&)`, called once per header after its
  // magic matched; its error fails the reader.
  template <class Check>
  Result<size_t> Feed(std::string_view data, Check&& check) {
    auto call = [&check](const WireHeader& h) -> Status { return check(h); };
    using Call = decltype(call);
    return FeedWith(
        data, [](void* c, const WireHeader& h) { return (*static_cast<Call*>(c))(h); }, &call);
  }

  bool has_frame() const { return stage_ == Stage::kReady; }
  // The waiting frame (has_frame() must be true); the reader moves on.
  WireFrame TakeFrame();

  // After TakeFrame() in kDetached mode: payload bytes of that frame still to
  // come; ConsumePayload(n) reports n bytes taken and returns the part of n
  // that was payload.
  uint64_t payload_remaining() const { return payload_remaining_; }
  uint64_t ConsumePayload(uint64_t n);

  // Bytes the frame in progress still needs before it is whole (the rest of
  // its header, then of its body, then of a buffered payload); 0 while a
  // frame waits. For readers that must not read past one frame.
  size_t wanted() const;

  // The end of the stream: OK between frames; else kInvalidArgument saying
  // where the stream was cut ("got 12 of 24 header bytes"), or the sticky
  // error.
  Status Finish() const;

  // Fails the reader for good with `status` (e.g. invalid limits); returns it.
  Status Fail(Status status);
  const Status& status() const { return status_; }
  // Bytes of the current partial frame held in memory.
  size_t buffered_bytes() const;

 private:
  enum class Stage { kHeader, kBody, kPayload, kReady };
  using CheckFn = Status (*)(void* check, const WireHeader& header);
  Result<size_t> FeedWith(std::string_view data, CheckFn check_fn, void* check);

  const FrameFormat* format_;
  Payload payload_mode_;
  Status status_;
  Stage stage_ = Stage::kHeader;
  std::array<char, 32> header_bytes_{};  // the largest header (cache protocol)
  size_t header_filled_ = 0;
  WireFrame frame_;
  uint64_t payload_remaining_ = 0;
  WireHeader detached_;  // the header of the frame whose payload is outstanding
};

}  // namespace granary::wire

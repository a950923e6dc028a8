// The frame layer shared by every protocol (wire_frame.h).

#include "granary/protocol/wire_frame.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <limits>
#include <utility>

#include "granary/core/names.h"

namespace granary::wire {

std::string DescribeFrame(std::string_view type_name, uint16_t type, bool hex_types,
                          bool has_request_id, uint64_t request_id) {
  std::string s = type_name.empty()
                      ? "frame of type " + (hex_types ? Hex16(type) : std::to_string(type))
                      : std::string(type_name) + " frame";
  if (has_request_id) s += " (request id " + std::to_string(request_id) + ")";
  return s;
}

std::string Hex16(uint16_t v) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s = "0x";
  for (int shift = 12; shift >= 0; shift -= 4) s += kHex[(v >> shift) & 0xf];
  return s;
}

std::string VersionRange(uint16_t min, uint16_t max) {
  return std::to_string(min) + ".." + std::to_string(max);
}

void PutHeader(const FrameFormat& format, const WireHeader& h, ByteWriter* out) {
  assert((format.has_flags || h.flags == 0) &&
         (format.has_payload_length || h.payload_length == 0) &&
         (format.has_request_id || h.request_id == 0));
  out->PutBytes(std::string_view(format.magic.data(), format.magic.size()));
  out->Put(h.version);
  out->Put(h.type);
  if (format.has_flags) out->Put(h.flags);
  out->Put(h.body_length);
  if (format.has_payload_length) out->Put(h.payload_length);
  if (format.has_request_id) out->Put(h.request_id);
}

std::string EncodeFrame(const FrameFormat& format, WireHeader header, std::string_view body) {
  // Every caller checks the body against its limits (all far below 4 GiB).
  assert(body.size() <= std::numeric_limits<uint32_t>::max());
  header.body_length = static_cast<uint32_t>(body.size());
  std::string out;
  out.reserve(format.header_size() + body.size());
  ByteWriter w(&out);
  PutHeader(format, header, &w);
  w.PutBytes(body);
  return out;
}

Result<WireHeader> ParseHeader(const FrameFormat& format, std::string_view bytes) {
  if (bytes.size() != format.header_size()) {
    return Status::InvalidArgument("read " + std::string(format.frame_noun) +
                                   " header: " + std::to_string(bytes.size()) + " bytes where " +
                                   std::to_string(format.header_size()) + " were expected");
  }
  const char* b = bytes.data();
  if (std::memcmp(b + kMagicOffset, format.magic.data(), format.magic.size()) != 0) {
    return Status::InvalidArgument(
        "read " + std::string(format.frame_noun) + " header: bad magic " +
        Quoted(bytes.substr(kMagicOffset, format.magic.size())) + " (expected " +
        Quoted(std::string_view(format.magic.data(), format.magic.size())) + "); " +
        std::string(format.bad_magic_advice));
  }
  WireHeader h;
  h.version = LoadLe<uint16_t>(b + kVersionOffset);
  h.type = LoadLe<uint16_t>(b + kTypeOffset);
  if (format.has_flags) h.flags = LoadLe<uint32_t>(b + format.flags_offset());
  h.body_length = LoadLe<uint32_t>(b + format.body_length_offset());
  if (format.has_payload_length) {
    h.payload_length = LoadLe<uint64_t>(b + format.payload_length_offset());
  }
  if (format.has_request_id) h.request_id = LoadLe<uint64_t>(b + format.request_id_offset());
  return h;
}

// ---------------------------------------------------------------------------
// FrameReader

Result<size_t> FrameReader::FeedWith(std::string_view data, CheckFn check_fn, void* check) {
  if (!status_.ok()) return status_;
  if (stage_ == Stage::kReady || payload_remaining_ > 0) return size_t{0};
  const size_t header_size = format_->header_size();
  size_t used = 0;
  while (stage_ != Stage::kReady) {
    if (stage_ == Stage::kHeader) {
      size_t n = std::min(data.size() - used, header_size - header_filled_);
      std::memcpy(header_bytes_.data() + header_filled_, data.data() + used, n);
      header_filled_ += n;
      used += n;
      if (header_filled_ < header_size) break;
      Result<WireHeader> h =
          ParseHeader(*format_, std::string_view(header_bytes_.data(), header_size));
      if (!h.ok()) return Fail(h.status());
      // The protocol's limits: nothing of the body is buffered before they pass.
      if (Status s = check_fn(check, *h); !s.ok()) return Fail(std::move(s));
      frame_.header = *h;
      stage_ = Stage::kBody;
    }
    if (stage_ == Stage::kBody) {
      const size_t final_size = frame_.header.body_length;
      size_t n = std::min(data.size() - used, final_size - frame_.body.size());
      if (n > 0) AppendWithin(&frame_.body, data.substr(used, n), final_size);
      used += n;
      if (frame_.body.size() < final_size) break;
      const bool payload = frame_.header.payload_length > 0;
      stage_ = payload && payload_mode_ == Payload::kBuffered ? Stage::kPayload : Stage::kReady;
    }
    if (stage_ == Stage::kPayload) {
      // The check bounded payload_length (the cache protocol: <= 1 GiB).
      const auto final_size = static_cast<size_t>(frame_.header.payload_length);
      size_t n = std::min(data.size() - used, final_size - frame_.payload.size());
      if (n > 0) AppendWithin(&frame_.payload, data.substr(used, n), final_size);
      used += n;
      if (frame_.payload.size() < final_size) break;
      stage_ = Stage::kReady;
    }
  }
  return used;
}

WireFrame FrameReader::TakeFrame() {
  assert(stage_ == Stage::kReady && "TakeFrame without a complete frame");
  WireFrame out = std::move(frame_);
  frame_ = WireFrame{};
  stage_ = Stage::kHeader;
  header_filled_ = 0;
  if (payload_mode_ == Payload::kDetached) {
    payload_remaining_ = out.header.payload_length;
    detached_ = out.header;
  }
  return out;
}

uint64_t FrameReader::ConsumePayload(uint64_t n) {
  uint64_t used = std::min(n, payload_remaining_);
  payload_remaining_ -= used;
  return used;
}

size_t FrameReader::wanted() const {
  switch (stage_) {
    case Stage::kHeader:
      return format_->header_size() - header_filled_;
    case Stage::kBody:
      return frame_.header.body_length - frame_.body.size();
    case Stage::kPayload:
      return static_cast<size_t>(frame_.header.payload_length) - frame_.payload.size();
    case Stage::kReady:
      return 0;
  }
  return 0;
}

Status FrameReader::Finish() const {
  if (!status_.ok()) return status_;
  auto cut = [&](const std::string& what) {
    return Status::InvalidArgument(std::string(format_->connection_noun) + " closed mid-frame: " +
                                   what + "; the peer stopped or the stream was truncated");
  };
  if (payload_remaining_ > 0) {
    return cut(std::to_string(payload_remaining_) + " payload bytes of the last " +
               format_->describe(detached_) + " missing");
  }
  switch (stage_) {
    case Stage::kReady:
      return Status::Ok();
    case Stage::kHeader:
      if (header_filled_ == 0) return Status::Ok();
      return cut("got " + std::to_string(header_filled_) + " of " +
                 std::to_string(format_->header_size()) + " header bytes");
    case Stage::kBody:
      return cut("got " + std::to_string(frame_.body.size()) + " of " +
                 std::to_string(frame_.header.body_length) + " body bytes of a " +
                 format_->describe(frame_.header));
    case Stage::kPayload:
      return cut("got " + std::to_string(frame_.payload.size()) + " of " +
                 std::to_string(frame_.header.payload_length) + " payload bytes of a " +
                 format_->describe(frame_.header));
  }
  return Status::Ok();
}

Status FrameReader::Fail(Status status) {
  status_ = std::move(status);
  return status_;
}

size_t FrameReader::buffered_bytes() const {
  return (stage_ == Stage::kHeader ? header_filled_ : 0) + frame_.body.capacity() +
         frame_.payload.capacity();
}

}  // namespace granary::wire

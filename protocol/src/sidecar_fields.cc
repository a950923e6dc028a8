// The sidecar protocol's field visitors and shared field rules
// (sidecar_fields.h).

#include "sidecar_fields.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cassert>
#include <limits>
#include <optional>

#include "granary/core/names.h"
#include "granary/protocol/protocol.h"  // ToWireStatus, FromWireStatus: the same code numbers
#include "granary/protocol/wire_frame.h"

namespace granary::sidecar_protocol::fields {

Status FieldInvalid(std::string_view field, const std::string& what) {
  return Status::InvalidArgument(std::string(field) + ": " + what);
}
Status FieldRange(std::string_view field, const std::string& what) {
  return Status::OutOfRange(std::string(field) + ": " + what);
}
Status Prefixed(const std::string& prefix, const Status& s) {
  return Status(s.code(), prefix + ": " + s.message());
}
std::string Indexed(std::string_view list, size_t i) {
  return std::string(list) + "[" + std::to_string(i) + "]";
}

Status CheckName(std::string_view field, std::string_view name) {
  if (name.empty() || name.size() > sf::kMaxNameLength) {
    return FieldInvalid(field, Quoted(name) + " must be 1.." + std::to_string(sf::kMaxNameLength) +
                                   " bytes long, is " + std::to_string(name.size()));
  }
  for (char c : name) {
    if (c < 0x21 || c > 0x7e) {
      return FieldInvalid(
          field, Quoted(name) + " may hold only graphic ASCII (no spaces or control bytes)");
    }
  }
  return Status::Ok();
}

Status CheckPath(std::string_view field, std::string_view path) {
  if (path.empty() || path.size() > sf::kMaxPathLength) {
    return FieldInvalid(field, "path " + Quoted(path) + " must be 1.." +
                                   std::to_string(sf::kMaxPathLength) + " bytes long, is " +
                                   std::to_string(path.size()));
  }
  return Status::Ok();
}

Status CheckToken(std::string_view field, uint64_t token) {
  if (token == 0) {
    return FieldInvalid(field, "token 0 pins nothing; release only tokens from SAMPLES items");
  }
  return Status::Ok();
}

Status CheckAskedCount(std::string_view field, uint32_t count, const Limits& limits) {
  if (count == 0) return FieldInvalid(field, "must be at least 1, is 0");
  if (count > limits.max_items) {
    return FieldRange(field, std::to_string(count) + " exceeds the limit of " +
                                 std::to_string(limits.max_items) +
                                 " entries per reply (limits.max_items)");
  }
  return Status::Ok();
}

Status CheckIndexRange(std::string_view field, std::string_view what, uint32_t first,
                       uint64_t count) {
  constexpr uint64_t kIndexSpace = uint64_t{1} << 32;  // ids and indices are u32
  if (first + count > kIndexSpace) {
    return FieldRange(field, std::string(what) + " " + std::to_string(first) + " + " +
                                 std::to_string(count) + " run past the largest " +
                                 (what == "ids" ? "sample id" : "index") + " (2^32 - 1)");
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// BodyWriter

void BodyWriter::StatusCode(std::string_view, const Status& s) { w_.Put(ToWireStatus(s.code())); }

// An OK status travels as code 0 and no message.
void BodyWriter::StatusMessage(std::string_view, const Status& s) {
  PutString(s.ok() ? std::string_view() : wire::Cut(s.message(), message_budget_));
}

void BodyWriter::PutString(std::string_view s) {
  // Every string is checked or cut to at most kMaxPathLength bytes first.
  assert(s.size() <= std::numeric_limits<uint16_t>::max());
  w_.Put(static_cast<uint16_t>(s.size()));
  w_.PutBytes(s);
}

void BodyWriter::PutManifestId(const ContentId& id) {
  std::array<uint8_t, sf::kManifestIdSize> bytes = id.ToBytes();
  w_.PutBytes(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

// How long the failed items' messages may be so that a reply of `fixed` bytes
// plus their messages fits max_body_bytes (at most kMaxMessageLength).
size_t BodyWriter::MessageBudget(size_t fixed, const std::vector<size_t>& lengths) const {
  const size_t max_body = limits_.max_body_bytes;
  size_t total = fixed;
  size_t failed = 0;
  for (size_t n : lengths) {
    total += std::min(n, sf::kMaxMessageLength);
    failed += n > 0 ? 1 : 0;
  }
  if (total <= max_body || failed == 0 || fixed >= max_body) return sf::kMaxMessageLength;
  return std::min(sf::kMaxMessageLength, (max_body - fixed) / failed);
}

// ---------------------------------------------------------------------------
// BodyReader

std::string BodyReader::Name(std::string_view name) const {
  if (list_.empty()) return std::string(name);
  if (name.empty()) return std::string(list_);
  return std::string(list_) + "." + std::string(name);
}

void BodyReader::Truncated(std::string_view name) {
  Fail(FieldInvalid(Name(name), "the body ends inside this field (" + std::to_string(body_size_) +
                                    " bytes); the sender is broken or speaks another version"));
}

void BodyReader::Bool(std::string_view name, bool& v) {
  uint8_t b = 0;
  Int(name, b);
  if (!ok()) return;
  if (b > 1) {
    Fail(FieldInvalid(Name(name), "is " + std::to_string(b) + ", must be 0 or 1"));
    return;
  }
  v = b == 1;
}

void BodyReader::ReadString(std::string_view name, std::string* s, size_t max_length) {
  uint16_t n = 0;
  Int(name, n);
  if (!ok()) return;
  if (n > max_length) {
    Fail(FieldRange(Name(name), "length " + std::to_string(n) + " exceeds the limit of " +
                                    std::to_string(max_length) + " bytes"));
    return;
  }
  std::string_view bytes;
  if (!reader_.GetBytes(n, &bytes)) return Truncated(name);
  s->assign(bytes);
}

void BodyReader::ReadManifestId(std::string_view name, ContentId* id) {
  std::string_view bytes;
  if (!ok()) return;
  if (!reader_.GetBytes(sf::kManifestIdSize, &bytes)) return Truncated(name);
  *id = ContentId::FromBytes(reinterpret_cast<const uint8_t*>(bytes.data()));
}

// A list's count: within max_items (kOutOfRange) and, at `min_size` bytes an
// element, within what is left of the body (kInvalidArgument). Checked before
// the caller sizes anything.
bool BodyReader::ReadCount(std::string_view name, uint32_t* n, size_t min_size) {
  Int(name, *n);
  if (!ok()) return false;
  if (*n > limits_.max_items) {
    Fail(FieldRange(Name(name), std::to_string(*n) + " items exceed the limit of " +
                                    std::to_string(limits_.max_items) +
                                    " per message (limits.max_items)"));
    return false;
  }
  if (uint64_t{*n} * min_size > reader_.remaining()) {
    Fail(FieldInvalid(Name(name), std::to_string(*n) + " items need at least " +
                                      std::to_string(uint64_t{*n} * min_size) +
                                      " bytes, the body has " +
                                      std::to_string(reader_.remaining()) + " left"));
    return false;
  }
  return true;
}

void BodyReader::UnknownFlags(std::string_view name, uint64_t flags, uint64_t bit,
                              std::string_view bit_name) {
  Fail(FieldInvalid(Name(name), "unknown flags " + std::to_string(flags) + " (only bit " +
                                    std::to_string(std::countr_zero(bit)) + ", " +
                                    std::string(bit_name) + ")"));
}

void BodyReader::StatusCode(std::string_view name, Status&) { Int(name, status_code_); }

// OK has no message; unknown codes become kInternal naming the number.
void BodyReader::StatusMessage(std::string_view name, Status& s) {
  std::string message;
  ReadString(name, &message, sf::kMaxMessageLength);
  if (!ok()) return;
  std::optional<granary::StatusCode> known = FromWireStatus(status_code_);
  if (!known.has_value()) {
    std::string m =
        "sidecar sent status code " + std::to_string(status_code_) + ", unknown to this build";
    if (!message.empty()) m += ": " + message;
    s = Status(granary::StatusCode::kInternal, std::move(m));
    return;
  }
  if (*known == granary::StatusCode::kOk) {
    if (!message.empty()) {
      Fail(FieldInvalid(Name(name), "status OK carries a message (" +
                                        std::to_string(message.size()) + " bytes); OK has none"));
      return;
    }
    s = Status::Ok();
    return;
  }
  s = Status(*known, std::move(message));
}

void BodyReader::End() {
  if (ok() && reader_.remaining() != 0) {
    Fail(Status::InvalidArgument(
        "body: " + std::to_string(reader_.remaining()) + " trailing bytes after the message (" +
        std::to_string(body_size_) + " bytes in all); the sender is broken"));
  }
}

// ---------------------------------------------------------------------------
// RuleChecker

std::string RuleChecker::Name(std::string_view name) const {
  if (list_.empty()) return std::string(name);
  return Indexed(list_, index_);
}

void RuleChecker::CheckCount(std::string_view name, size_t count) {
  if (!ok() || count <= limits_.max_items) return;
  Fail(FieldRange(Name(name), std::to_string(count) + " items exceed the limit of " +
                                  std::to_string(limits_.max_items) +
                                  " per message (limits.max_items); split the request"));
}

}  // namespace granary::sidecar_protocol::fields

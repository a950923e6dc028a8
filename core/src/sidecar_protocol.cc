#include "granary/core/sidecar_protocol.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "granary/core/byte_order.h"
#include "granary/core/metadata_store.h"
#include "granary/core/names.h"
#include "granary/core/plan.h"
#include "granary/core/protocol.h"    // ToWireStatus, FromWireStatus: the same code numbers
#include "granary/core/names.h"  // ValidatePlanId

namespace granary::sidecar_protocol {
namespace {

// Fixed frame header (docs/protocol.md, "Sidecar protocol").
constexpr size_t kMagicOffset = 0;
constexpr size_t kVersionOffset = 4;
constexpr size_t kTypeOffset = 6;
constexpr size_t kFlagsOffset = 8;
constexpr size_t kBodyLengthOffset = 12;
constexpr size_t kRequestIdOffset = 16;
static_assert(kRequestIdOffset + 8 == kFrameHeaderSize);

constexpr uint16_t kErrorFlagClosing = 0x0001;
constexpr uint8_t kItemFlagHint = 0x01;
constexpr size_t kMaxPlanIdLength = 128;
constexpr uint64_t kIdSpace = uint64_t{1} << 32;  // sample ids are u32

// Smallest encodings of list elements: a count is accepted only if that many
// elements could fit in what is left of the body, before anything is reserved.
constexpr size_t kTokenSize = 8;
constexpr size_t kIdSize = 4;
constexpr size_t kWireStatusMinSize = 2 + 2;                    // code, message length
constexpr size_t kSampleItemFixedSize = 4 + 1 + 8 + 8 + 8 + 8;  // + wire status
constexpr size_t kSampleItemMinSize = kSampleItemFixedSize + kWireStatusMinSize;  // 41
constexpr size_t kStatEntryMinSize = 8 + 8 + 2 + 1;            // size, mtime, path >= 1
constexpr size_t kLookupItemMinSize = 4 + kWireStatusMinSize;  // id, status
constexpr size_t kDirectoryItemMinSize = 2 + 2 + 1;            // mode, path >= 1
constexpr size_t kPathMinSize = 2 + 1;                         // length, >= 1 byte
constexpr size_t kSamplesFixedSize = 4 + 1;                    // count, end_of_epoch
constexpr size_t kLookupReplyFixedSize = 4;                    // count

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

bool IsSpokenVersion(uint16_t v) { return v >= kMinVersion && v <= kMaxVersion; }

std::string VersionRange() {
  return std::to_string(kMinVersion) + ".." + std::to_string(kMaxVersion);
}

bool IsRequestType(uint16_t t) {
  return t >= static_cast<uint16_t>(MessageType::kHello) &&
         t <= static_cast<uint16_t>(MessageType::kDirectories);
}
bool IsReplyType(uint16_t t) {
  return t >= static_cast<uint16_t>(MessageType::kHelloReply) &&
         t <= static_cast<uint16_t>(MessageType::kDirectoriesReply);
}
bool IsHandshakeType(uint16_t t) {
  return t == static_cast<uint16_t>(MessageType::kHello) ||
         t == static_cast<uint16_t>(MessageType::kHelloReply);
}

// "GET", or "message type 4242" for a number this build does not know.
std::string TypeText(uint16_t type) {
  std::string_view name = MessageTypeName(type);
  if (name == "unknown") return "message type " + std::to_string(type);
  return std::string(name);
}

// "GET frame (request id 7)".
std::string FrameWhat(const FrameHeader& h) {
  return TypeText(h.type) + " frame (request id " + std::to_string(h.request_id) + ")";
}

// kVersionMismatch when a frame of `version` cannot carry `type`.
Status CheckTypeInVersion(const std::string& what, uint16_t type, uint16_t version) {
  const uint16_t needs = MinVersionOf(type);
  if (version >= needs) return Status::Ok();
  return Status::VersionMismatch(
      what + ": version: " + TypeText(type) + " exists from sidecar protocol version " +
      std::to_string(needs) + ", this frame is version " + std::to_string(version) +
      "; a connection that agreed on an older version cannot use it (upgrade the older side)");
}

// The same error with `prefix` before its message (the code is kept).
Status Prefixed(const std::string& prefix, const Status& s) {
  return Status(s.code(), prefix + ": " + s.message());
}

std::string_view Cut(std::string_view s, size_t max) {
  return s.substr(0, std::min(s.size(), max));
}

// ---------------------------------------------------------------------------
// Field rules, shared by the encoders and the decoders: whatever an encoder
// produces, a decoder with the same limits accepts. Each error names the field;
// the caller adds the message type.

Status FieldInvalid(std::string_view field, const std::string& what) {
  return Status::InvalidArgument(std::string(field) + ": " + what);
}
Status FieldRange(std::string_view field, const std::string& what) {
  return Status::OutOfRange(std::string(field) + ": " + what);
}

std::string Indexed(std::string_view list, size_t i) {
  return std::string(list) + "[" + std::to_string(i) + "]";
}

Status CheckName(std::string_view field, std::string_view name) {
  if (name.empty() || name.size() > kMaxNameLength) {
    return FieldInvalid(field, Quoted(name) + " must be 1.." + std::to_string(kMaxNameLength) +
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

Status CheckVersionRange(uint16_t min_version, uint16_t max_version) {
  if (min_version == 0 || min_version > max_version) {
    return FieldInvalid("min_version/max_version", "range " + std::to_string(min_version) + ".." +
                                                       std::to_string(max_version) +
                                                       " is empty or starts at 0");
  }
  return Status::Ok();
}

Status CheckCount(std::string_view field, size_t count, uint32_t max_items) {
  if (count > max_items) {
    return FieldRange(field, std::to_string(count) + " items exceed the limit of " +
                                 std::to_string(max_items) +
                                 " per message (limits.max_items); split the request");
  }
  return Status::Ok();
}

Status CheckTokens(std::string_view field, const std::vector<uint64_t>& tokens,
                   uint32_t max_items) {
  GRANARY_RETURN_IF_ERROR(CheckCount(field, tokens.size(), max_items));
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] == 0) {
      return FieldInvalid(Indexed(field, i),
                          "token 0 pins nothing; release only tokens from SAMPLES items");
    }
  }
  return Status::Ok();
}

Status CheckPath(std::string_view field, std::string_view path) {
  if (path.empty() || path.size() > kMaxPathLength) {
    return FieldInvalid(field, "path " + Quoted(path) + " must be 1.." +
                                   std::to_string(kMaxPathLength) + " bytes long, is " +
                                   std::to_string(path.size()));
  }
  return Status::Ok();
}

// [first_id, first_id + count) within the u32 id space.
Status CheckIdRange(std::string_view field, uint32_t first_id, uint64_t count) {
  if (first_id + count > kIdSpace) {
    return FieldRange(field, "ids " + std::to_string(first_id) + " + " + std::to_string(count) +
                                 " run past the largest sample id (2^32 - 1)");
  }
  return Status::Ok();
}

Status CheckRequest(const Request& request, const Limits& limits) {
  return std::visit(
      Overloaded{
          [&](const Hello& m) -> Status {
            GRANARY_RETURN_IF_ERROR(CheckVersionRange(m.min_version, m.max_version));
            return CheckName("client_name", m.client_name);
          },
          [&](const Open& m) -> Status {
            Status s = ValidateDatasetName(m.dataset);
            if (!s.ok()) return Prefixed("dataset", s);
            return Status::Ok();
          },
          [&](const SetPlan& m) -> Status {
            Status s = ValidatePlanId(m.plan_id);
            if (!s.ok()) return Prefixed("plan_id", s);
            if (m.epoch > kMaxPlanEpoch) {
              return FieldRange("epoch", std::to_string(m.epoch) + " is past the largest epoch " +
                                             std::to_string(kMaxPlanEpoch));
            }
            if (m.world_size == 0) return FieldInvalid("world_size", "must be at least 1, is 0");
            if (m.rank >= m.world_size) {
              return FieldInvalid("rank", std::to_string(m.rank) + " must be below world_size " +
                                              std::to_string(m.world_size));
            }
            if (m.batch_size == 0) return FieldInvalid("batch_size", "must be at least 1, is 0");
            if (m.mode > 2) {
              return FieldInvalid("mode", "unknown plan mode " + std::to_string(m.mode) +
                                              " (0 global, 1 chunkwise, 2 sequential)");
            }
            if (m.window_chunks == 0) {
              return FieldInvalid("window_chunks", "must be at least 1, is 0");
            }
            return Status::Ok();
          },
          [&](const Get& m) -> Status {
            GRANARY_RETURN_IF_ERROR(CheckTokens("release", m.release, limits.max_items));
            GRANARY_RETURN_IF_ERROR(CheckCount("ids", m.ids.size(), limits.max_items));
            if (m.ids.empty()) {
              return FieldInvalid("ids",
                                  "no ids; ask for at least one (send RELEASE to only "
                                  "release)");
            }
            if (uint64_t{m.ids.size()} + m.lookahead > limits.max_items) {
              return FieldRange("lookahead", std::to_string(m.ids.size()) + " ids + lookahead " +
                                                 std::to_string(m.lookahead) +
                                                 " exceed the limit of " +
                                                 std::to_string(limits.max_items) +
                                                 " items per reply (limits.max_items)");
            }
            return Status::Ok();
          },
          [&](const Next& m) -> Status {
            GRANARY_RETURN_IF_ERROR(CheckTokens("release", m.release, limits.max_items));
            if (m.max_samples == 0) return FieldInvalid("max_samples", "must be at least 1, is 0");
            if (m.max_samples > limits.max_items) {
              return FieldRange("max_samples", std::to_string(m.max_samples) +
                                                   " exceeds the limit of " +
                                                   std::to_string(limits.max_items) +
                                                   " items per reply (limits.max_items)");
            }
            return Status::Ok();
          },
          [&](const Release& m) -> Status {
            return CheckTokens("tokens", m.tokens, limits.max_items);
          },
          [&](const Stat& m) -> Status {
            if (m.count == 0) return FieldInvalid("count", "must be at least 1, is 0");
            if (m.count > limits.max_items) {
              return FieldRange("count", std::to_string(m.count) + " exceeds the limit of " +
                                             std::to_string(limits.max_items) +
                                             " entries per reply (limits.max_items)");
            }
            return CheckIdRange("first_id/count", m.first_id, m.count);
          },
          [&](const Lookup& m) -> Status {
            GRANARY_RETURN_IF_ERROR(CheckCount("paths", m.paths.size(), limits.max_items));
            if (m.paths.empty()) return FieldInvalid("paths", "no paths; look up at least one");
            for (size_t i = 0; i < m.paths.size(); ++i) {
              GRANARY_RETURN_IF_ERROR(CheckPath(Indexed("paths", i), m.paths[i]));
            }
            return Status::Ok();
          },
          [&](const Ping&) -> Status { return Status::Ok(); },
          [&](const Directories& m) -> Status {
            if (m.count == 0) return FieldInvalid("count", "must be at least 1, is 0");
            if (m.count > limits.max_items) {
              return FieldRange("count", std::to_string(m.count) + " exceeds the limit of " +
                                             std::to_string(limits.max_items) +
                                             " entries per reply (limits.max_items)");
            }
            if (uint64_t{m.first} + m.count > kIdSpace) {
              return FieldRange("first/count", "directories " + std::to_string(m.first) + " + " +
                                                   std::to_string(m.count) +
                                                   " run past the largest index (2^32 - 1)");
            }
            return Status::Ok();
          },
      },
      request);
}

Status CheckReply(const Reply& reply, const Limits& limits) {
  return std::visit(
      Overloaded{
          [&](const HelloReply& m) -> Status {
            if (!IsSpokenVersion(m.version)) {
              return Status::VersionMismatch("version: " + std::to_string(m.version) +
                                             " is not spoken by this build (" + VersionRange() +
                                             ")");
            }
            GRANARY_RETURN_IF_ERROR(CheckName("sidecar_name", m.sidecar_name));
            Status s = m.limits.Validate();
            if (!s.ok()) return Prefixed("limits", s);
            return Status::Ok();
          },
          [&](const OpenReply& m) -> Status {
            if (m.manifest_id.IsZero()) {
              return FieldInvalid("manifest_id", "is zero; a session reads one snapshot");
            }
            if (m.arena_bytes == 0) return FieldInvalid("arena_bytes", "must be at least 1, is 0");
            return Status::Ok();
          },
          [&](const Ok&) -> Status { return Status::Ok(); },
          [&](const Samples& m) -> Status {
            GRANARY_RETURN_IF_ERROR(CheckCount("items", m.items.size(), limits.max_items));
            for (size_t i = 0; i < m.items.size(); ++i) {
              const SampleItem& item = m.items[i];
              if (item.status.ok()) {
                if (item.token == 0) {
                  return FieldInvalid(Indexed("items", i),
                                      "sample " + std::to_string(item.id) +
                                          " is OK but has token 0 (every delivered range is "
                                          "pinned by a nonzero token)");
                }
                if (item.offset > std::numeric_limits<uint64_t>::max() - item.length) {
                  return FieldRange(Indexed("items", i),
                                    "offset " + std::to_string(item.offset) + " + length " +
                                        std::to_string(item.length) + " overflows 64 bits");
                }
              } else {
                if (item.token != 0 || item.offset != 0 || item.length != 0 || item.checksum != 0) {
                  return FieldInvalid(Indexed("items", i),
                                      "sample " + std::to_string(item.id) + " failed (" +
                                          std::string(StatusCodeName(item.status.code())) +
                                          ") but has a token, a range or a checksum");
                }
                if (item.hint) {
                  return FieldInvalid(Indexed("items", i),
                                      "sample " + std::to_string(item.id) +
                                          " is a lookahead hint that failed; hints are only "
                                          "samples already in the arena");
                }
              }
            }
            return Status::Ok();
          },
          [&](const StatReply& m) -> Status {
            GRANARY_RETURN_IF_ERROR(CheckCount("entries", m.entries.size(), limits.max_items));
            GRANARY_RETURN_IF_ERROR(CheckIdRange("first_id/entries", m.first_id, m.entries.size()));
            for (size_t i = 0; i < m.entries.size(); ++i) {
              GRANARY_RETURN_IF_ERROR(CheckPath(Indexed("entries", i), m.entries[i].path));
            }
            return Status::Ok();
          },
          [&](const LookupReply& m) -> Status {
            GRANARY_RETURN_IF_ERROR(CheckCount("items", m.items.size(), limits.max_items));
            for (size_t i = 0; i < m.items.size(); ++i) {
              const LookupItem& item = m.items[i];
              if (!item.status.ok() && item.id != 0) {
                return FieldInvalid(Indexed("items", i),
                                    "failed (" + std::string(StatusCodeName(item.status.code())) +
                                        ") but names id " + std::to_string(item.id) +
                                        " (must be 0)");
              }
            }
            return Status::Ok();
          },
          [&](const Pong&) -> Status { return Status::Ok(); },
          [&](const Error& m) -> Status {
            if (m.status.ok())
              return FieldInvalid("status", "an ERROR must carry a failure, not OK");
            return Status::Ok();
          },
          [&](const DirectoriesReply& m) -> Status {
            GRANARY_RETURN_IF_ERROR(CheckCount("entries", m.entries.size(), limits.max_items));
            if (m.first > m.total || m.entries.size() > uint64_t{m.total} - m.first) {
              return FieldRange("first/total/entries",
                                std::to_string(m.entries.size()) + " entries from index " +
                                    std::to_string(m.first) + " run past the " +
                                    std::to_string(m.total) + " directories announced");
            }
            for (size_t i = 0; i < m.entries.size(); ++i) {
              GRANARY_RETURN_IF_ERROR(CheckPath(Indexed("entries", i), m.entries[i].path));
              if (m.entries[i].mode > kMaxDirectoryMode) {
                return FieldInvalid(
                    Indexed("entries", i),
                    "mode " + std::to_string(m.entries[i].mode) + " has bits beyond 07777");
              }
            }
            return Status::Ok();
          },
      },
      reply);
}

// ---------------------------------------------------------------------------
// Encoding

uint16_t TypeOf(const Request& r) {
  static constexpr MessageType kTypes[] = {
      MessageType::kHello, MessageType::kOpen,       MessageType::kSetPlan, MessageType::kGet,
      MessageType::kNext,  MessageType::kRelease,    MessageType::kStat,    MessageType::kLookup,
      MessageType::kPing,  MessageType::kDirectories};
  static_assert(std::size(kTypes) == std::variant_size_v<Request>);
  return static_cast<uint16_t>(kTypes[r.index()]);
}

uint16_t TypeOf(const Reply& r) {
  static constexpr MessageType kTypes[] = {
      MessageType::kHelloReply, MessageType::kOpenReply, MessageType::kOk,
      MessageType::kSamples,    MessageType::kStatReply, MessageType::kLookupReply,
      MessageType::kPong,       MessageType::kError,     MessageType::kDirectoriesReply};
  static_assert(std::size(kTypes) == std::variant_size_v<Reply>);
  return static_cast<uint16_t>(kTypes[r.index()]);
}

void PutString(ByteWriter* w, std::string_view s) {
  // Every string is checked or cut to at most kMaxPathLength bytes first.
  assert(s.size() <= std::numeric_limits<uint16_t>::max());
  w->Put(static_cast<uint16_t>(s.size()));
  w->PutBytes(s);
}

void PutTokens(ByteWriter* w, const std::vector<uint64_t>& tokens) {
  w->Put(static_cast<uint32_t>(tokens.size()));
  for (uint64_t t : tokens) w->Put(t);
}

// An OK status travels as code 0 and no message.
void PutStatus(ByteWriter* w, const Status& s, size_t max_message) {
  w->Put(ToWireStatus(s.code()));
  PutString(w, s.ok() ? std::string_view() : Cut(s.message(), max_message));
}

void PutFrameHeader(ByteWriter* w, uint16_t version, uint16_t type, uint32_t body_length,
                    uint64_t request_id) {
  w->PutBytes(std::string_view(kMagic, sizeof(kMagic)));
  w->Put(version);
  w->Put(type);
  w->Put(uint32_t{0});
  w->Put(body_length);
  w->Put(request_id);
}

// How long the failed items' messages may be so that a reply of `fixed` bytes
// plus their messages fits `max_body` (at most kMaxMessageLength).
size_t ItemMessageBudget(size_t fixed, const std::vector<size_t>& lengths, uint32_t max_body) {
  size_t total = fixed;
  size_t failed = 0;
  for (size_t n : lengths) {
    total += std::min(n, kMaxMessageLength);
    failed += n > 0 ? 1 : 0;
  }
  if (total <= max_body || failed == 0 || fixed >= max_body) return kMaxMessageLength;
  return std::min(kMaxMessageLength, (max_body - fixed) / failed);
}

void EncodeRequestBody(const Request& request, ByteWriter* w) {
  std::visit(Overloaded{
                 [&](const Hello& m) {
                   w->Put(m.min_version);
                   w->Put(m.max_version);
                   PutString(w, m.client_name);
                 },
                 [&](const Open& m) { PutString(w, m.dataset); },
                 [&](const SetPlan& m) {
                   w->Put(m.seed);
                   w->Put(m.epoch);
                   w->Put(m.start_position);
                   w->Put(m.world_size);
                   w->Put(m.rank);
                   w->Put(m.batch_size);
                   w->Put(m.window_chunks);
                   w->Put(m.mode);
                   w->Put(static_cast<uint8_t>(m.drop_last ? 1 : 0));
                   PutString(w, m.plan_id);
                 },
                 [&](const Get& m) {
                   w->Put(m.lookahead);
                   PutTokens(w, m.release);
                   w->Put(static_cast<uint32_t>(m.ids.size()));
                   for (uint32_t id : m.ids) w->Put(id);
                 },
                 [&](const Next& m) {
                   w->Put(m.max_samples);
                   PutTokens(w, m.release);
                 },
                 [&](const Release& m) { PutTokens(w, m.tokens); },
                 [&](const Stat& m) {
                   w->Put(m.first_id);
                   w->Put(m.count);
                 },
                 [&](const Lookup& m) {
                   w->Put(static_cast<uint32_t>(m.paths.size()));
                   for (const std::string& p : m.paths) PutString(w, p);
                 },
                 [&](const Ping&) {},
                 [&](const Directories& m) {
                   w->Put(m.first);
                   w->Put(m.count);
                 },
             },
             request);
}

void EncodeReplyBody(const Reply& reply, const Limits& limits, ByteWriter* w) {
  std::visit(
      Overloaded{
          [&](const HelloReply& m) {
            w->Put(m.version);
            w->Put(m.limits.max_body_bytes);
            w->Put(m.limits.max_items);
            PutString(w, m.sidecar_name);
          },
          [&](const OpenReply& m) {
            std::array<uint8_t, 16> id = m.manifest_id.ToBytes();
            w->PutBytes(std::string_view(reinterpret_cast<const char*>(id.data()), id.size()));
            w->Put(m.sample_count);
            w->Put(m.total_bytes);
            w->Put(m.chunk_count);
            w->Put(m.arena_bytes);
          },
          [&](const Ok&) {},
          [&](const Samples& m) {
            std::vector<size_t> lengths;
            lengths.reserve(m.items.size());
            for (const SampleItem& item : m.items) {
              lengths.push_back(item.status.ok() ? 0 : item.status.message().size());
            }
            size_t budget =
                ItemMessageBudget(kSamplesFixedSize + m.items.size() * kSampleItemMinSize, lengths,
                                  limits.max_body_bytes);
            w->Put(static_cast<uint32_t>(m.items.size()));
            w->Put(static_cast<uint8_t>(m.end_of_epoch ? 1 : 0));
            for (const SampleItem& item : m.items) {
              w->Put(item.id);
              w->Put(uint8_t{item.hint ? kItemFlagHint : uint8_t{0}});
              w->Put(item.token);
              w->Put(item.offset);
              w->Put(item.length);
              w->Put(item.checksum);
              PutStatus(w, item.status, budget);
            }
          },
          [&](const StatReply& m) {
            w->Put(m.first_id);
            w->Put(static_cast<uint32_t>(m.entries.size()));
            for (const StatEntry& e : m.entries) {
              w->Put(e.size);
              w->Put(e.mtime_ns);
              PutString(w, e.path);
            }
          },
          [&](const LookupReply& m) {
            std::vector<size_t> lengths;
            lengths.reserve(m.items.size());
            for (const LookupItem& item : m.items) {
              lengths.push_back(item.status.ok() ? 0 : item.status.message().size());
            }
            size_t budget =
                ItemMessageBudget(kLookupReplyFixedSize + m.items.size() * kLookupItemMinSize,
                                  lengths, limits.max_body_bytes);
            w->Put(static_cast<uint32_t>(m.items.size()));
            for (const LookupItem& item : m.items) {
              w->Put(item.id);
              PutStatus(w, item.status, budget);
            }
          },
          [&](const Pong&) {},
          [&](const Error& m) {
            w->Put(ToWireStatus(m.status.code()));
            w->Put(m.closing ? kErrorFlagClosing : uint16_t{0});
            PutString(w, Cut(m.status.message(), kMaxMessageLength));
          },
          [&](const DirectoriesReply& m) {
            w->Put(m.first);
            w->Put(m.total);
            w->Put(static_cast<uint32_t>(m.entries.size()));
            for (const DirectoryItem& e : m.entries) {
              w->Put(e.mode);
              PutString(w, e.path);
            }
          },
      },
      reply);
}

Result<std::string> Assemble(const std::string& what, uint16_t version, uint16_t type,
                             uint64_t request_id, const std::string& body, const Limits& limits) {
  if (body.size() > limits.max_body_bytes) {
    return Status::OutOfRange(what + ": body of " + std::to_string(body.size()) +
                              " bytes exceeds the receiver's limit of " +
                              std::to_string(limits.max_body_bytes) +
                              " bytes (limits.max_body_bytes); split the message");
  }
  std::string out;
  out.reserve(kFrameHeaderSize + body.size());
  ByteWriter w(&out);
  PutFrameHeader(&w, version, type, static_cast<uint32_t>(body.size()), request_id);
  w.PutBytes(body);
  return out;
}

// ---------------------------------------------------------------------------
// Decoding

// Reads one message body, naming the frame and the field in every error.
class BodyReader {
 public:
  explicit BodyReader(const Frame& frame) : header_(frame.header), reader_(frame.body) {}

  // "decode GET frame (request id 7): <field>: <what>", with the field error's code.
  Status Fail(const Status& field_error) const {
    return Prefixed("decode " + FrameWhat(header_), field_error);
  }

  template <typename T>
  Status Get(T* v, std::string_view field) {
    if (!reader_.Get(v)) return Truncated(field);
    return Status::Ok();
  }

  Status Bool(bool* v, std::string_view field) {
    uint8_t b = 0;
    GRANARY_RETURN_IF_ERROR(Get(&b, field));
    if (b > 1) return Fail(FieldInvalid(field, "is " + std::to_string(b) + ", must be 0 or 1"));
    *v = b == 1;
    return Status::Ok();
  }

  // u16 length + bytes; a length over `max_length` is kOutOfRange.
  Status String(std::string* s, std::string_view field, size_t max_length) {
    uint16_t n = 0;
    GRANARY_RETURN_IF_ERROR(Get(&n, field));
    if (n > max_length) {
      return Fail(FieldRange(field, "length " + std::to_string(n) + " exceeds the limit of " +
                                        std::to_string(max_length) + " bytes"));
    }
    std::string_view bytes;
    if (!reader_.GetBytes(n, &bytes)) return Truncated(field);
    s->assign(bytes);
    return Status::Ok();
  }

  // A list's count: within `max_items` (kOutOfRange) and, at `min_size` bytes
  // an element, within what is left of the body (kInvalidArgument). Checked
  // before the caller reserves anything.
  Status Count(uint32_t* n, std::string_view field, uint32_t max_items, size_t min_size) {
    GRANARY_RETURN_IF_ERROR(Get(n, field));
    if (*n > max_items) {
      return Fail(FieldRange(field, std::to_string(*n) + " items exceed the limit of " +
                                        std::to_string(max_items) +
                                        " per message (limits.max_items)"));
    }
    if (uint64_t{*n} * min_size > reader_.remaining()) {
      return Fail(FieldInvalid(field, std::to_string(*n) + " items need at least " +
                                          std::to_string(uint64_t{*n} * min_size) +
                                          " bytes, the body has " +
                                          std::to_string(reader_.remaining()) + " left"));
    }
    return Status::Ok();
  }

  Status Tokens(std::vector<uint64_t>* tokens, std::string_view field, uint32_t max_items) {
    uint32_t n = 0;
    GRANARY_RETURN_IF_ERROR(Count(&n, field, max_items, kTokenSize));
    tokens->resize(n);
    for (uint64_t& t : *tokens) GRANARY_RETURN_IF_ERROR(Get(&t, field));
    return Status::Ok();
  }

  // code u16 + message; OK has no message, unknown codes become kInternal
  // naming the number.
  Status WireStatus(Status* out, std::string_view field) {
    uint16_t code = 0;
    GRANARY_RETURN_IF_ERROR(Get(&code, field));
    std::string message;
    GRANARY_RETURN_IF_ERROR(String(&message, field, kMaxMessageLength));
    std::optional<StatusCode> known = FromWireStatus(code);
    if (!known.has_value()) {
      std::string m =
          "sidecar sent status code " + std::to_string(code) + ", unknown to this build";
      if (!message.empty()) m += ": " + message;
      *out = Status(StatusCode::kInternal, std::move(m));
      return Status::Ok();
    }
    if (*known == StatusCode::kOk) {
      if (!message.empty()) {
        return Fail(FieldInvalid(field, "status OK carries a message (" +
                                            std::to_string(message.size()) +
                                            " bytes); OK has none"));
      }
      *out = Status::Ok();
      return Status::Ok();
    }
    *out = Status(*known, std::move(message));
    return Status::Ok();
  }

  Status End() const {
    if (reader_.remaining() != 0) {
      return Fail(Status::InvalidArgument(
          "body: " + std::to_string(reader_.remaining()) + " trailing bytes after the message (" +
          std::to_string(header_.body_length) + " bytes in all); the sender is broken"));
    }
    return Status::Ok();
  }

 private:
  Status Truncated(std::string_view field) const {
    return Fail(FieldInvalid(field, "the body ends inside this field (" +
                                        std::to_string(header_.body_length) +
                                        " bytes); the sender is broken or speaks another version"));
  }

  const FrameHeader& header_;
  ByteReader reader_;
};

// A Frame may come from anywhere, not only from a FrameDecoder.
Status CheckFrameShape(const Frame& f) {
  const FrameHeader& h = f.header;
  if (f.body.size() != h.body_length) {
    return Status::InvalidArgument("decode " + FrameWhat(h) + ": header: announces " +
                                   std::to_string(h.body_length) + " body bytes, the frame holds " +
                                   std::to_string(f.body.size()));
  }
  if (!IsSpokenVersion(h.version)) {
    return Status::VersionMismatch("decode " + FrameWhat(h) +
                                   ": version: " + std::to_string(h.version) +
                                   " is not spoken by this build (" + VersionRange() + ")");
  }
  if (IsHandshakeType(h.type) && h.version != kHandshakeVersion) {
    return Status::VersionMismatch("decode " + FrameWhat(h) + ": version: sent as " +
                                   std::to_string(h.version) + ", " + TypeText(h.type) +
                                   " is always version " + std::to_string(kHandshakeVersion));
  }
  return CheckTypeInVersion("decode " + FrameWhat(h), h.type, h.version);
}

Result<Request> DecodeRequestBody(const Frame& f, const Limits& limits) {
  BodyReader r(f);
  Request out;
  switch (static_cast<MessageType>(f.header.type)) {
    case MessageType::kHello: {
      Hello m;
      GRANARY_RETURN_IF_ERROR(r.Get(&m.min_version, "min_version"));
      GRANARY_RETURN_IF_ERROR(r.Get(&m.max_version, "max_version"));
      GRANARY_RETURN_IF_ERROR(r.String(&m.client_name, "client_name", kMaxNameLength));
      out = std::move(m);
      break;
    }
    case MessageType::kOpen: {
      Open m;
      GRANARY_RETURN_IF_ERROR(r.String(&m.dataset, "dataset", kMaxDnsLabelLength));
      out = std::move(m);
      break;
    }
    case MessageType::kSetPlan: {
      SetPlan m;
      GRANARY_RETURN_IF_ERROR(r.Get(&m.seed, "seed"));
      GRANARY_RETURN_IF_ERROR(r.Get(&m.epoch, "epoch"));
      GRANARY_RETURN_IF_ERROR(r.Get(&m.start_position, "start_position"));
      GRANARY_RETURN_IF_ERROR(r.Get(&m.world_size, "world_size"));
      GRANARY_RETURN_IF_ERROR(r.Get(&m.rank, "rank"));
      GRANARY_RETURN_IF_ERROR(r.Get(&m.batch_size, "batch_size"));
      GRANARY_RETURN_IF_ERROR(r.Get(&m.window_chunks, "window_chunks"));
      GRANARY_RETURN_IF_ERROR(r.Get(&m.mode, "mode"));
      GRANARY_RETURN_IF_ERROR(r.Bool(&m.drop_last, "drop_last"));
      GRANARY_RETURN_IF_ERROR(r.String(&m.plan_id, "plan_id", kMaxPlanIdLength));
      out = std::move(m);
      break;
    }
    case MessageType::kGet: {
      Get m;
      GRANARY_RETURN_IF_ERROR(r.Get(&m.lookahead, "lookahead"));
      GRANARY_RETURN_IF_ERROR(r.Tokens(&m.release, "release", limits.max_items));
      uint32_t n = 0;
      GRANARY_RETURN_IF_ERROR(r.Count(&n, "ids", limits.max_items, kIdSize));
      m.ids.resize(n);
      for (uint32_t& id : m.ids) GRANARY_RETURN_IF_ERROR(r.Get(&id, "ids"));
      out = std::move(m);
      break;
    }
    case MessageType::kNext: {
      Next m;
      GRANARY_RETURN_IF_ERROR(r.Get(&m.max_samples, "max_samples"));
      GRANARY_RETURN_IF_ERROR(r.Tokens(&m.release, "release", limits.max_items));
      out = std::move(m);
      break;
    }
    case MessageType::kRelease: {
      Release m;
      GRANARY_RETURN_IF_ERROR(r.Tokens(&m.tokens, "tokens", limits.max_items));
      out = std::move(m);
      break;
    }
    case MessageType::kStat: {
      Stat m;
      GRANARY_RETURN_IF_ERROR(r.Get(&m.first_id, "first_id"));
      GRANARY_RETURN_IF_ERROR(r.Get(&m.count, "count"));
      out = m;
      break;
    }
    case MessageType::kLookup: {
      Lookup m;
      uint32_t n = 0;
      GRANARY_RETURN_IF_ERROR(r.Count(&n, "paths", limits.max_items, kPathMinSize));
      m.paths.resize(n);
      for (std::string& p : m.paths) GRANARY_RETURN_IF_ERROR(r.String(&p, "paths", kMaxPathLength));
      out = std::move(m);
      break;
    }
    case MessageType::kPing:
      out = Ping{};
      break;
    case MessageType::kDirectories: {
      Directories m;
      GRANARY_RETURN_IF_ERROR(r.Get(&m.first, "first"));
      GRANARY_RETURN_IF_ERROR(r.Get(&m.count, "count"));
      out = m;
      break;
    }
    default:
      return Status::Internal("DecodeRequestBody called with a type that is not a request");
  }
  GRANARY_RETURN_IF_ERROR(r.End());
  Status s = CheckRequest(out, limits);
  if (!s.ok()) return r.Fail(s);
  return out;
}

Result<Reply> DecodeReplyBody(const Frame& f, const Limits& limits) {
  BodyReader r(f);
  Reply out;
  switch (static_cast<MessageType>(f.header.type)) {
    case MessageType::kHelloReply: {
      HelloReply m;
      GRANARY_RETURN_IF_ERROR(r.Get(&m.version, "version"));
      GRANARY_RETURN_IF_ERROR(r.Get(&m.limits.max_body_bytes, "limits.max_body_bytes"));
      GRANARY_RETURN_IF_ERROR(r.Get(&m.limits.max_items, "limits.max_items"));
      GRANARY_RETURN_IF_ERROR(r.String(&m.sidecar_name, "sidecar_name", kMaxNameLength));
      out = std::move(m);
      break;
    }
    case MessageType::kOpenReply: {
      OpenReply m;
      std::array<uint8_t, 16> id{};
      for (uint8_t& b : id) GRANARY_RETURN_IF_ERROR(r.Get(&b, "manifest_id"));
      m.manifest_id = ContentId::FromBytes(id.data());
      GRANARY_RETURN_IF_ERROR(r.Get(&m.sample_count, "sample_count"));
      GRANARY_RETURN_IF_ERROR(r.Get(&m.total_bytes, "total_bytes"));
      GRANARY_RETURN_IF_ERROR(r.Get(&m.chunk_count, "chunk_count"));
      GRANARY_RETURN_IF_ERROR(r.Get(&m.arena_bytes, "arena_bytes"));
      out = m;
      break;
    }
    case MessageType::kOk:
      out = Ok{};
      break;
    case MessageType::kSamples: {
      Samples m;
      uint32_t n = 0;
      GRANARY_RETURN_IF_ERROR(r.Count(&n, "items", limits.max_items, kSampleItemMinSize));
      GRANARY_RETURN_IF_ERROR(r.Bool(&m.end_of_epoch, "end_of_epoch"));
      m.items.resize(n);
      for (SampleItem& item : m.items) {
        uint8_t flags = 0;
        GRANARY_RETURN_IF_ERROR(r.Get(&item.id, "items.id"));
        GRANARY_RETURN_IF_ERROR(r.Get(&flags, "items.flags"));
        if ((flags & ~kItemFlagHint) != 0) {
          return r.Fail(FieldInvalid("items.flags", "sample " + std::to_string(item.id) +
                                                        " has unknown flags " +
                                                        std::to_string(flags) + " (only bit 0)"));
        }
        item.hint = (flags & kItemFlagHint) != 0;
        GRANARY_RETURN_IF_ERROR(r.Get(&item.token, "items.token"));
        GRANARY_RETURN_IF_ERROR(r.Get(&item.offset, "items.offset"));
        GRANARY_RETURN_IF_ERROR(r.Get(&item.length, "items.length"));
        GRANARY_RETURN_IF_ERROR(r.Get(&item.checksum, "items.checksum"));
        GRANARY_RETURN_IF_ERROR(r.WireStatus(&item.status, "items.status"));
      }
      out = std::move(m);
      break;
    }
    case MessageType::kStatReply: {
      StatReply m;
      GRANARY_RETURN_IF_ERROR(r.Get(&m.first_id, "first_id"));
      uint32_t n = 0;
      GRANARY_RETURN_IF_ERROR(r.Count(&n, "entries", limits.max_items, kStatEntryMinSize));
      m.entries.resize(n);
      for (StatEntry& e : m.entries) {
        GRANARY_RETURN_IF_ERROR(r.Get(&e.size, "entries.size"));
        GRANARY_RETURN_IF_ERROR(r.Get(&e.mtime_ns, "entries.mtime_ns"));
        GRANARY_RETURN_IF_ERROR(r.String(&e.path, "entries.path", kMaxPathLength));
      }
      out = std::move(m);
      break;
    }
    case MessageType::kLookupReply: {
      LookupReply m;
      uint32_t n = 0;
      GRANARY_RETURN_IF_ERROR(r.Count(&n, "items", limits.max_items, kLookupItemMinSize));
      m.items.resize(n);
      for (LookupItem& item : m.items) {
        GRANARY_RETURN_IF_ERROR(r.Get(&item.id, "items.id"));
        GRANARY_RETURN_IF_ERROR(r.WireStatus(&item.status, "items.status"));
      }
      out = std::move(m);
      break;
    }
    case MessageType::kPong:
      out = Pong{};
      break;
    case MessageType::kError: {
      Error m;
      uint16_t code = 0;
      uint16_t flags = 0;
      std::string message;
      GRANARY_RETURN_IF_ERROR(r.Get(&code, "status"));
      GRANARY_RETURN_IF_ERROR(r.Get(&flags, "flags"));
      GRANARY_RETURN_IF_ERROR(r.String(&message, "message", kMaxMessageLength));
      if ((flags & ~kErrorFlagClosing) != 0) {
        return r.Fail(FieldInvalid(
            "flags", "unknown flags " + std::to_string(flags) + " (only bit 0, closing)"));
      }
      m.closing = (flags & kErrorFlagClosing) != 0;
      std::optional<StatusCode> known = FromWireStatus(code);
      if (!known.has_value()) {
        std::string text =
            "sidecar sent status code " + std::to_string(code) + ", unknown to this build";
        if (!message.empty()) text += ": " + message;
        m.status = Status(StatusCode::kInternal, std::move(text));
      } else if (*known == StatusCode::kOk) {
        return r.Fail(FieldInvalid("status", "an ERROR must carry a failure, not OK"));
      } else {
        m.status = Status(*known, std::move(message));
      }
      out = std::move(m);
      break;
    }
    case MessageType::kDirectoriesReply: {
      DirectoriesReply m;
      GRANARY_RETURN_IF_ERROR(r.Get(&m.first, "first"));
      GRANARY_RETURN_IF_ERROR(r.Get(&m.total, "total"));
      uint32_t n = 0;
      GRANARY_RETURN_IF_ERROR(r.Count(&n, "entries", limits.max_items, kDirectoryItemMinSize));
      m.entries.resize(n);
      for (DirectoryItem& e : m.entries) {
        GRANARY_RETURN_IF_ERROR(r.Get(&e.mode, "entries.mode"));
        GRANARY_RETURN_IF_ERROR(r.String(&e.path, "entries.path", kMaxPathLength));
      }
      out = std::move(m);
      break;
    }
    default:
      return Status::Internal("DecodeReplyBody called with a type that is not a reply");
  }
  GRANARY_RETURN_IF_ERROR(r.End());
  Status s = CheckReply(out, limits);
  if (!s.ok()) return r.Fail(s);
  return out;
}

// Frame header checks of FrameDecoder: a failure here is a framing error.
Status CheckHeader(const char* b, const Limits& limits, FrameHeader* h) {
  static const std::string kAdvice =
      "; the stream cannot be trusted any more: close the connection";
  if (std::memcmp(b + kMagicOffset, kMagic, sizeof(kMagic)) != 0) {
    return Status::InvalidArgument(
        "read sidecar frame header: magic: " +
        Quoted(std::string_view(b + kMagicOffset, sizeof(kMagic))) +
        " is not 'GRSC'; the peer does not speak Granary's sidecar protocol or the stream lost "
        "its place: close the connection");
  }
  h->version = LoadLe<uint16_t>(b + kVersionOffset);
  h->type = LoadLe<uint16_t>(b + kTypeOffset);
  uint32_t flags = LoadLe<uint32_t>(b + kFlagsOffset);
  h->body_length = LoadLe<uint32_t>(b + kBodyLengthOffset);
  h->request_id = LoadLe<uint64_t>(b + kRequestIdOffset);
  if (!IsSpokenVersion(h->version)) {
    return Status::VersionMismatch(
        "read " + FrameWhat(*h) + ": version: " + std::to_string(h->version) +
        " is not spoken by this build (" + VersionRange() + "); close and reconnect with HELLO");
  }
  if (flags != 0) {
    return Status::InvalidArgument("read " + FrameWhat(*h) + ": flags: " + std::to_string(flags) +
                                   ", must be 0" + kAdvice);
  }
  if (h->body_length > limits.max_body_bytes) {
    return Status::OutOfRange(
        "read " + FrameWhat(*h) + ": body_length: " + std::to_string(h->body_length) +
        " bytes exceed the limit of " + std::to_string(limits.max_body_bytes) +
        " (limits.max_body_bytes, advertised in HELLO_REPLY)" + kAdvice);
  }
  return Status::Ok();
}

}  // namespace

// ---------------------------------------------------------------------------
// Limits, names, versions

Status Limits::Validate() const {
  if (max_body_bytes < 4096 || max_body_bytes > kMaxBodyBytesCap) {
    return Status::InvalidArgument("sidecar protocol limits: max_body_bytes " +
                                   std::to_string(max_body_bytes) + " must be 4096.." +
                                   std::to_string(kMaxBodyBytesCap));
  }
  if (max_items == 0 || max_items > kMaxItemsCap) {
    return Status::InvalidArgument("sidecar protocol limits: max_items " +
                                   std::to_string(max_items) + " must be 1.." +
                                   std::to_string(kMaxItemsCap));
  }
  return Status::Ok();
}

Limits CommonLimits(const Limits& a, const Limits& b) {
  return Limits{std::min(a.max_body_bytes, b.max_body_bytes), std::min(a.max_items, b.max_items)};
}

std::string_view MessageTypeName(uint16_t type) {
  switch (static_cast<MessageType>(type)) {
    case MessageType::kHello:
      return "HELLO";
    case MessageType::kOpen:
      return "OPEN";
    case MessageType::kSetPlan:
      return "SET_PLAN";
    case MessageType::kGet:
      return "GET";
    case MessageType::kNext:
      return "NEXT";
    case MessageType::kRelease:
      return "RELEASE";
    case MessageType::kStat:
      return "STAT";
    case MessageType::kLookup:
      return "LOOKUP";
    case MessageType::kPing:
      return "PING";
    case MessageType::kHelloReply:
      return "HELLO_REPLY";
    case MessageType::kOpenReply:
      return "OPEN_REPLY";
    case MessageType::kOk:
      return "OK";
    case MessageType::kSamples:
      return "SAMPLES";
    case MessageType::kStatReply:
      return "STAT_REPLY";
    case MessageType::kLookupReply:
      return "LOOKUP_REPLY";
    case MessageType::kPong:
      return "PONG";
    case MessageType::kError:
      return "ERROR";
    case MessageType::kDirectories:
      return "DIRECTORIES";
    case MessageType::kDirectoriesReply:
      return "DIRECTORIES_REPLY";
  }
  return "unknown";
}

uint16_t MinVersionOf(uint16_t type) {
  switch (static_cast<MessageType>(type)) {
    case MessageType::kDirectories:
    case MessageType::kDirectoriesReply:
      return kDirectoriesVersion;
    default:
      return kMinVersion;
  }
}

Result<uint16_t> NegotiateVersion(const Hello& hello) {
  if (hello.min_version == 0 || hello.min_version > hello.max_version) {
    return Status::InvalidArgument("negotiate sidecar protocol version with client " +
                                   Quoted(hello.client_name) + ": its version range " +
                                   std::to_string(hello.min_version) + ".." +
                                   std::to_string(hello.max_version) + " is empty or starts at 0");
  }
  uint16_t low = std::max(hello.min_version, kMinVersion);
  uint16_t high = std::min(hello.max_version, kMaxVersion);
  if (low > high) {
    return Status::VersionMismatch("negotiate sidecar protocol version with client " +
                                   Quoted(hello.client_name) + ": it speaks versions " +
                                   std::to_string(hello.min_version) + ".." +
                                   std::to_string(hello.max_version) + ", this sidecar " +
                                   VersionRange() + "; upgrade the older side");
  }
  return high;
}

// ---------------------------------------------------------------------------
// Encoders

Result<std::string> EncodeRequest(uint64_t request_id, const Request& request, const Limits& limits,
                                  uint16_t version) {
  const uint16_t type = TypeOf(request);
  const std::string what =
      "encode " + TypeText(type) + " request (id " + std::to_string(request_id) + ")";
  Status valid = limits.Validate();
  if (!valid.ok()) return Prefixed(what, valid);
  if (!IsSpokenVersion(version)) {
    return Status::InvalidArgument(what + ": version " + std::to_string(version) +
                                   " is not spoken by this build (" + VersionRange() + ")");
  }
  if (IsHandshakeType(type)) version = kHandshakeVersion;
  GRANARY_RETURN_IF_ERROR(CheckTypeInVersion(what, type, version));
  if (request_id == 0) {
    return Status::InvalidArgument(
        what +
        ": request id 0 is reserved for errors that blame no request; number requests "
        "from 1");
  }
  Status s = CheckRequest(request, limits);
  if (!s.ok()) return Prefixed(what, s);
  std::string body;
  ByteWriter w(&body);
  EncodeRequestBody(request, &w);
  return Assemble(what, version, type, request_id, body, limits);
}

Result<std::string> EncodeReply(uint64_t request_id, const Reply& reply, const Limits& limits,
                                uint16_t version) {
  const uint16_t type = TypeOf(reply);
  const std::string what =
      "encode " + TypeText(type) + " reply (request id " + std::to_string(request_id) + ")";
  Status valid = limits.Validate();
  if (!valid.ok()) return Prefixed(what, valid);
  if (!IsSpokenVersion(version)) {
    return Status::InvalidArgument(what + ": version " + std::to_string(version) +
                                   " is not spoken by this build (" + VersionRange() + ")");
  }
  if (IsHandshakeType(type)) version = kHandshakeVersion;
  GRANARY_RETURN_IF_ERROR(CheckTypeInVersion(what, type, version));
  if (request_id == 0 && type != static_cast<uint16_t>(MessageType::kError)) {
    return Status::InvalidArgument(what +
                                   ": request id 0 is only for an ERROR that blames no request");
  }
  Status s = CheckReply(reply, limits);
  if (!s.ok()) return Prefixed(what, s);
  std::string body;
  ByteWriter w(&body);
  EncodeReplyBody(reply, limits, &w);
  return Assemble(what, version, type, request_id, body, limits);
}

std::string EncodeError(uint64_t request_id, const Status& status, bool closing, uint16_t version) {
  Status sent = status.ok() ? Status::Internal("request " + std::to_string(request_id) +
                                               " failed with no error recorded (a sidecar bug)")
                            : status;
  if (!IsSpokenVersion(version)) version = kHandshakeVersion;
  std::string body;
  ByteWriter bw(&body);
  EncodeReplyBody(Error{sent, closing}, Limits{}, &bw);
  std::string out;
  out.reserve(kFrameHeaderSize + body.size());
  ByteWriter w(&out);
  PutFrameHeader(&w, version, static_cast<uint16_t>(MessageType::kError),
                 static_cast<uint32_t>(body.size()), request_id);
  w.PutBytes(body);
  return out;
}

// ---------------------------------------------------------------------------
// Decoders

Result<Request> DecodeRequest(const Frame& frame, const Limits& limits) {
  const FrameHeader& h = frame.header;
  GRANARY_RETURN_IF_ERROR(CheckFrameShape(frame));
  if (IsReplyType(h.type)) {
    return Status::InvalidArgument("decode " + FrameWhat(h) +
                                   ": type: a reply type; a sidecar accepts requests only");
  }
  if (!IsRequestType(h.type)) {
    return Status::InvalidArgument("decode " + FrameWhat(h) + ": type: unknown request type " +
                                   std::to_string(h.type) +
                                   "; the client may speak a newer protocol");
  }
  if (h.request_id == 0) {
    return Status::InvalidArgument(
        "decode " + FrameWhat(h) +
        ": request_id: 0 is reserved for errors that blame no request; number requests from 1");
  }
  return DecodeRequestBody(frame, limits);
}

Result<Reply> DecodeReply(const Frame& frame, const Limits& limits) {
  const FrameHeader& h = frame.header;
  GRANARY_RETURN_IF_ERROR(CheckFrameShape(frame));
  if (IsRequestType(h.type)) {
    return Status::InvalidArgument("decode " + FrameWhat(h) +
                                   ": type: a request type; a client accepts replies only");
  }
  if (!IsReplyType(h.type)) {
    return Status::InvalidArgument("decode " + FrameWhat(h) + ": type: unknown reply type " +
                                   std::to_string(h.type) +
                                   "; the sidecar may speak a newer protocol");
  }
  if (h.request_id == 0 && h.type != static_cast<uint16_t>(MessageType::kError)) {
    return Status::InvalidArgument("decode " + FrameWhat(h) +
                                   ": request_id: 0 is only for an ERROR that blames no request");
  }
  return DecodeReplyBody(frame, limits);
}

// ---------------------------------------------------------------------------
// FrameDecoder

FrameDecoder::FrameDecoder(Limits limits) : limits_(limits) {
  Status s = limits_.Validate();
  if (!s.ok()) status_ = s.WithContext("sidecar frame decoder");
}

Status FrameDecoder::Fail(Status status) {
  status_ = std::move(status);
  return status_;
}

Result<size_t> FrameDecoder::Feed(std::string_view data) {
  if (!status_.ok()) return status_;
  if (has_frame_) return size_t{0};
  size_t used = 0;
  if (!in_body_) {
    size_t n = std::min(data.size(), kFrameHeaderSize - header_filled_);
    std::memcpy(header_bytes_ + header_filled_, data.data(), n);
    header_filled_ += n;
    used += n;
    if (header_filled_ < kFrameHeaderSize) return used;
    Status s = CheckHeader(header_bytes_, limits_, &frame_.header);
    if (!s.ok()) return Fail(std::move(s));
    in_body_ = true;
  }
  const size_t want = frame_.header.body_length - frame_.body.size();
  const size_t n = std::min(data.size() - used, want);
  if (n > 0) AppendWithin(&frame_.body, data.substr(used, n), frame_.header.body_length);
  used += n;
  if (frame_.body.size() == frame_.header.body_length) has_frame_ = true;
  return used;
}

Frame FrameDecoder::TakeFrame() {
  assert(has_frame_ && "TakeFrame without a complete frame");
  Frame out = std::move(frame_);
  frame_ = Frame{};
  has_frame_ = false;
  in_body_ = false;
  header_filled_ = 0;
  return out;
}

Status FrameDecoder::Finish() const {
  if (!status_.ok()) return status_;
  if (has_frame_) return Status::Ok();
  auto cut = [](const std::string& what) {
    return Status::InvalidArgument("sidecar connection closed mid-frame: " + what +
                                   "; the peer stopped or the stream was truncated");
  };
  if (in_body_) {
    return cut("got " + std::to_string(frame_.body.size()) + " of " +
               std::to_string(frame_.header.body_length) + " body bytes of a " +
               FrameWhat(frame_.header));
  }
  if (header_filled_ == 0) return Status::Ok();
  return cut("got " + std::to_string(header_filled_) + " of " + std::to_string(kFrameHeaderSize) +
             " header bytes");
}

size_t FrameDecoder::buffered_bytes() const {
  return (in_body_ ? 0 : header_filled_) + frame_.body.capacity();
}

Result<Frame> DecodeFrame(std::string_view bytes, const Limits& limits) {
  FrameDecoder decoder(limits);
  GRANARY_ASSIGN_OR_RETURN(size_t used, decoder.Feed(bytes));
  if (!decoder.has_frame()) {
    Status cut = decoder.Finish();
    if (cut.ok()) return Status::InvalidArgument("decode sidecar frame: no bytes to decode");
    return cut;
  }
  if (used != bytes.size()) {
    return Status::InvalidArgument("decode sidecar frame: " + std::to_string(bytes.size() - used) +
                                   " trailing bytes after a " +
                                   FrameWhat(decoder.TakeFrame().header));
  }
  return decoder.TakeFrame();
}

}  // namespace granary::sidecar_protocol

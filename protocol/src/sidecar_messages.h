#pragma once

// Every sidecar protocol message body, described once: its fields in wire
// order, each with its name and its rule (sidecar_fields.h has the
// vocabulary). EncodeRequest/EncodeReply, DecodeRequest/DecodeReply and the
// checks both run are these descriptions walked by BodyWriter, BodyReader and
// RuleChecker; sidecar_protocol_format.h and docs/protocol.md ("Sidecar
// messages") show the same layouts as bytes.
//
// To add a field: add it to the struct in sidecar_protocol.h and one line
// here (and, if it changes a body, a protocol version: MinVersionOf). To add
// a message: its struct and variant alternative in sidecar_protocol.h, a
// kType* in sidecar_protocol_format.h and MessageType, its kTypeOf below, and
// its Fields.

#include <concepts>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "granary/core/names.h"
#include "granary/core/plan.h"
#include "granary/protocol/sidecar_protocol.h"
#include "sidecar_fields.h"

namespace granary::sidecar_protocol::fields {

// The wire type of each message struct.
template <class M>
inline constexpr uint16_t kTypeOf = 0;
template <>
inline constexpr uint16_t kTypeOf<Hello> = sf::kTypeHello;
template <>
inline constexpr uint16_t kTypeOf<Open> = sf::kTypeOpen;
template <>
inline constexpr uint16_t kTypeOf<SetPlan> = sf::kTypeSetPlan;
template <>
inline constexpr uint16_t kTypeOf<Get> = sf::kTypeGet;
template <>
inline constexpr uint16_t kTypeOf<Next> = sf::kTypeNext;
template <>
inline constexpr uint16_t kTypeOf<Release> = sf::kTypeRelease;
template <>
inline constexpr uint16_t kTypeOf<Stat> = sf::kTypeStat;
template <>
inline constexpr uint16_t kTypeOf<Lookup> = sf::kTypeLookup;
template <>
inline constexpr uint16_t kTypeOf<Ping> = sf::kTypePing;
template <>
inline constexpr uint16_t kTypeOf<Directories> = sf::kTypeDirectories;
template <>
inline constexpr uint16_t kTypeOf<ChunkFiles> = sf::kTypeChunkFiles;
template <>
inline constexpr uint16_t kTypeOf<HelloReply> = sf::kTypeHelloReply;
template <>
inline constexpr uint16_t kTypeOf<OpenReply> = sf::kTypeOpenReply;
template <>
inline constexpr uint16_t kTypeOf<Ok> = sf::kTypeOk;
template <>
inline constexpr uint16_t kTypeOf<Samples> = sf::kTypeSamples;
template <>
inline constexpr uint16_t kTypeOf<StatReply> = sf::kTypeStatReply;
template <>
inline constexpr uint16_t kTypeOf<LookupReply> = sf::kTypeLookupReply;
template <>
inline constexpr uint16_t kTypeOf<Pong> = sf::kTypePong;
template <>
inline constexpr uint16_t kTypeOf<Error> = sf::kTypeError;
template <>
inline constexpr uint16_t kTypeOf<DirectoriesReply> = sf::kTypeDirectoriesReply;
template <>
inline constexpr uint16_t kTypeOf<ChunkFilesReply> = sf::kTypeChunkFilesReply;

// M is T or const T: one description serves the writer and the checker
// (const) and the reader.
template <class M, class T>
concept Is = std::same_as<std::remove_const_t<M>, T>;

// ---- requests -------------------------------------------------------------------

template <class V, Is<Hello> M>
void Fields(V& v, M& m) {
  v.Int("min_version", m.min_version);
  v.Int("max_version", m.max_version);
  v.Rule([&](std::string_view) {
    if (m.min_version != 0 && m.min_version <= m.max_version) return Status::Ok();
    return FieldInvalid("min_version/max_version", "range " + std::to_string(m.min_version) + ".." +
                                                       std::to_string(m.max_version) +
                                                       " is empty or starts at 0");
  });
  v.String("client_name", m.client_name, sf::kMaxNameLength,
           [&](std::string_view f) { return CheckName(f, m.client_name); });
}

template <class V, Is<Open> M>
void Fields(V& v, M& m) {
  v.String("dataset", m.dataset, sf::kMaxDatasetLength, [&](std::string_view f) {
    Status s = ValidateDatasetName(m.dataset);
    return s.ok() ? s : Prefixed(std::string(f), s);
  });
}

template <class V, Is<SetPlan> M>
void Fields(V& v, M& m) {
  auto at_least_1 = [](std::string_view f, uint64_t n) {
    return n == 0 ? FieldInvalid(f, "must be at least 1, is 0") : Status::Ok();
  };
  v.Int("seed", m.seed);
  v.Int("epoch", m.epoch, [&](std::string_view f) {
    if (m.epoch <= kMaxPlanEpoch) return Status::Ok();
    return FieldRange(
        f, std::to_string(m.epoch) + " is past the largest epoch " + std::to_string(kMaxPlanEpoch));
  });
  v.Int("start_position", m.start_position);
  v.Int("world_size", m.world_size,
        [&](std::string_view f) { return at_least_1(f, m.world_size); });
  v.Int("rank", m.rank, [&](std::string_view f) {
    if (m.rank < m.world_size) return Status::Ok();
    return FieldInvalid(
        f, std::to_string(m.rank) + " must be below world_size " + std::to_string(m.world_size));
  });
  v.Int("batch_size", m.batch_size,
        [&](std::string_view f) { return at_least_1(f, m.batch_size); });
  v.Int("window_chunks", m.window_chunks,
        [&](std::string_view f) { return at_least_1(f, m.window_chunks); });
  v.Int("mode", m.mode, [&](std::string_view f) {
    if (m.mode <= 2) return Status::Ok();
    return FieldInvalid(f, "unknown plan mode " + std::to_string(m.mode) +
                               " (0 global, 1 chunkwise, 2 sequential)");
  });
  v.Bool("drop_last", m.drop_last);
  v.String("plan_id", m.plan_id, sf::kMaxPlanIdLength, [&](std::string_view f) {
    Status s = ValidatePlanId(m.plan_id);
    return s.ok() ? s : Prefixed(std::string(f), s);
  });
}

// A list of tokens to release: u32 count, u64 each, none 0.
template <class V, class L>
void Tokens(V& v, std::string_view name, L& tokens) {
  v.Count(name, tokens, sf::kTokenSize);
  v.Each(name, tokens, [&](auto& token) {
    v.Int("", token, [&](std::string_view f) { return CheckToken(f, token); });
  });
}

template <class V, Is<Get> M>
void Fields(V& v, M& m) {
  v.Int("lookahead", m.lookahead);
  Tokens(v, "release", m.release);
  v.Count("ids", m.ids, sf::kIdSize);
  v.Rule([&](std::string_view) {
    if (!m.ids.empty()) return Status::Ok();
    return FieldInvalid("ids", "no ids; ask for at least one (send RELEASE to only release)");
  });
  v.Each("ids", m.ids, [&](auto& id) { v.Int("", id); });
  v.Rule([&](std::string_view) {
    const uint32_t max_items = v.limits().max_items;
    if (uint64_t{m.ids.size()} + m.lookahead <= max_items) return Status::Ok();
    return FieldRange("lookahead", std::to_string(m.ids.size()) + " ids + lookahead " +
                                       std::to_string(m.lookahead) + " exceed the limit of " +
                                       std::to_string(max_items) +
                                       " items per reply (limits.max_items)");
  });
}

template <class V, Is<Next> M>
void Fields(V& v, M& m) {
  v.Int("max_samples", m.max_samples, [&](std::string_view f) {
    if (m.max_samples == 0) return FieldInvalid(f, "must be at least 1, is 0");
    if (m.max_samples <= v.limits().max_items) return Status::Ok();
    return FieldRange(f, std::to_string(m.max_samples) + " exceeds the limit of " +
                             std::to_string(v.limits().max_items) +
                             " items per reply (limits.max_items)");
  });
  Tokens(v, "release", m.release);
}

template <class V, Is<Release> M>
void Fields(V& v, M& m) {
  Tokens(v, "tokens", m.tokens);
}

template <class V, Is<Stat> M>
void Fields(V& v, M& m) {
  v.Int("first_id", m.first_id);
  v.Int("count", m.count,
        [&](std::string_view f) { return CheckAskedCount(f, m.count, v.limits()); });
  v.Rule([&](std::string_view) {
    return CheckIndexRange("first_id/count", "ids", m.first_id, m.count);
  });
}

template <class V, Is<Lookup> M>
void Fields(V& v, M& m) {
  v.Count("paths", m.paths, sf::kPathMinSize);
  v.Rule([&](std::string_view) {
    return m.paths.empty() ? FieldInvalid("paths", "no paths; look up at least one") : Status::Ok();
  });
  v.Each("paths", m.paths, [&](auto& path) {
    v.String("", path, sf::kMaxPathLength, [&](std::string_view f) { return CheckPath(f, path); });
  });
}

template <class V, Is<Ping> M>
void Fields(V&, M&) {}

template <class V, Is<Directories> M>
void Fields(V& v, M& m) {
  v.Int("first", m.first);
  v.Int("count", m.count,
        [&](std::string_view f) { return CheckAskedCount(f, m.count, v.limits()); });
  v.Rule([&](std::string_view) {
    return CheckIndexRange("first/count", "directories", m.first, m.count);
  });
}

template <class V, Is<ChunkFiles> M>
void Fields(V& v, M& m) {
  v.Count("ids", m.ids, sf::kIdSize);
  v.Rule([&](std::string_view) {
    if (m.ids.empty()) return FieldInvalid("ids", "no ids; ask for at least one");
    if (m.ids.size() <= v.limits().max_items) return Status::Ok();
    return FieldRange("ids", std::to_string(m.ids.size()) + " ids exceed the limit of " +
                                 std::to_string(v.limits().max_items) +
                                 " items (limits.max_items)");
  });
  v.Each("ids", m.ids, [&](auto& id) { v.Int("", id); });
}

// ---- replies --------------------------------------------------------------------

template <class V, Is<HelloReply> M>
void Fields(V& v, M& m) {
  v.Int("version", m.version, [&](std::string_view f) {
    if (m.version >= kMinVersion && m.version <= kMaxVersion) return Status::Ok();
    return Status::VersionMismatch(std::string(f) + ": " + std::to_string(m.version) +
                                   " is not spoken by this build (" + std::to_string(kMinVersion) +
                                   ".." + std::to_string(kMaxVersion) + ")");
  });
  v.Int("limits.max_body_bytes", m.limits.max_body_bytes);
  v.Int("limits.max_items", m.limits.max_items);
  v.String("sidecar_name", m.sidecar_name, sf::kMaxNameLength,
           [&](std::string_view f) { return CheckName(f, m.sidecar_name); });
  v.Rule([&](std::string_view) {
    Status s = m.limits.Validate();
    return s.ok() ? s : Prefixed("limits", s);
  });
}

template <class V, Is<OpenReply> M>
void Fields(V& v, M& m) {
  v.ManifestId("manifest_id", m.manifest_id, [&](std::string_view f) {
    return m.manifest_id.IsZero() ? FieldInvalid(f, "is zero; a session reads one snapshot")
                                  : Status::Ok();
  });
  v.Int("sample_count", m.sample_count);
  v.Int("total_bytes", m.total_bytes);
  v.Int("chunk_count", m.chunk_count);
  v.Int("arena_bytes", m.arena_bytes, [&](std::string_view f) {
    return m.arena_bytes == 0 ? FieldInvalid(f, "must be at least 1, is 0") : Status::Ok();
  });
}

template <class V, Is<Ok> M>
void Fields(V&, M&) {}

template <class V, Is<SampleItem> M>
void Fields(V& v, M& item) {
  v.Int("id", item.id);
  v.Flag("flags", item.hint, sf::kSampleFlagHint, "hint");
  v.Int("token", item.token);
  v.Int("offset", item.offset);
  v.Int("length", item.length);
  v.Int("checksum", item.checksum);
  v.WireStatus("status", item.status);
  v.Rule([&](std::string_view f) {
    const std::string sample = "sample " + std::to_string(item.id);
    if (item.status.ok()) {
      if (item.token == 0) {
        return FieldInvalid(f, sample +
                                   " is OK but has token 0 (every delivered range is pinned by "
                                   "a nonzero token)");
      }
      if (item.offset > std::numeric_limits<uint64_t>::max() - item.length) {
        return FieldRange(f, "offset " + std::to_string(item.offset) + " + length " +
                                 std::to_string(item.length) + " overflows 64 bits");
      }
      return Status::Ok();
    }
    if (item.token != 0 || item.offset != 0 || item.length != 0 || item.checksum != 0) {
      return FieldInvalid(f, sample + " failed (" +
                                 std::string(StatusCodeName(item.status.code())) +
                                 ") but has a token, a range or a checksum");
    }
    if (item.hint) {
      return FieldInvalid(f, sample +
                                 " is a lookahead hint that failed; hints are only samples "
                                 "already in the arena");
    }
    return Status::Ok();
  });
}

template <class V, Is<Samples> M>
void Fields(V& v, M& m) {
  v.FitMessages(m.items, sf::kSamplesFixedSize, sf::kSampleItemMinSize);
  v.Count("items", m.items, sf::kSampleItemMinSize);
  v.Bool("end_of_epoch", m.end_of_epoch);
  v.Each("items", m.items, [&](auto& item) { Fields(v, item); });
}

template <class V, Is<StatEntry> M>
void Fields(V& v, M& e) {
  v.Int("size", e.size);
  v.Int("mtime_ns", e.mtime_ns);
  v.String("path", e.path, sf::kMaxPathLength,
           [&](std::string_view f) { return CheckPath(f, e.path); });
}

template <class V, Is<StatReply> M>
void Fields(V& v, M& m) {
  v.Int("first_id", m.first_id);
  v.Count("entries", m.entries, sf::kStatEntryMinSize);
  v.Rule([&](std::string_view) {
    return CheckIndexRange("first_id/entries", "ids", m.first_id, m.entries.size());
  });
  v.Each("entries", m.entries, [&](auto& e) { Fields(v, e); });
}

template <class V, Is<LookupItem> M>
void Fields(V& v, M& item) {
  v.Int("id", item.id);
  v.WireStatus("status", item.status);
  v.Rule([&](std::string_view f) {
    if (item.status.ok() || item.id == 0) return Status::Ok();
    return FieldInvalid(f, "failed (" + std::string(StatusCodeName(item.status.code())) +
                               ") but names id " + std::to_string(item.id) + " (must be 0)");
  });
}

template <class V, Is<LookupReply> M>
void Fields(V& v, M& m) {
  v.FitMessages(m.items, sf::kLookupReplyFixedSize, sf::kLookupItemMinSize);
  v.Count("items", m.items, sf::kLookupItemMinSize);
  v.Each("items", m.items, [&](auto& item) { Fields(v, item); });
}

template <class V, Is<Pong> M>
void Fields(V&, M&) {}

template <class V, Is<Error> M>
void Fields(V& v, M& m) {
  v.StatusCode("status", m.status);
  v.Flag("flags", m.closing, sf::kErrorFlagClosing, "closing");
  v.StatusMessage("message", m.status);
  v.Rule([&](std::string_view) {
    if (!m.status.ok()) return Status::Ok();
    return FieldInvalid("status", "an ERROR must carry a failure, not OK");
  });
}

template <class V, Is<DirectoryItem> M>
void Fields(V& v, M& e) {
  v.Int("mode", e.mode, [&](std::string_view f) {
    if (e.mode <= sf::kMaxDirectoryMode) return Status::Ok();
    return FieldInvalid(f, "mode " + std::to_string(e.mode) + " has bits beyond 07777");
  });
  v.String("path", e.path, sf::kMaxPathLength,
           [&](std::string_view f) { return CheckPath(f, e.path); });
}

template <class V, Is<DirectoriesReply> M>
void Fields(V& v, M& m) {
  v.Int("first", m.first);
  v.Int("total", m.total);
  v.Count("entries", m.entries, sf::kDirectoryItemMinSize);
  v.Rule([&](std::string_view) {
    if (m.first <= m.total && m.entries.size() <= uint64_t{m.total} - m.first) return Status::Ok();
    return FieldRange("first/total/entries", std::to_string(m.entries.size()) +
                                                 " entries from index " + std::to_string(m.first) +
                                                 " run past the " + std::to_string(m.total) +
                                                 " directories announced");
  });
  v.Each("entries", m.entries, [&](auto& e) { Fields(v, e); });
}

template <class V, Is<DirectSample> M>
void Fields(V& v, M& d) {
  v.Int("id", d.id);
  v.Int("offset", d.offset);
  v.Int("length", d.length);
  v.Int("checksum", d.checksum);
  v.Rule([&](std::string_view f) {
    if (d.offset <= std::numeric_limits<uint64_t>::max() - d.length) return Status::Ok();
    return FieldRange(f, "offset " + std::to_string(d.offset) + " + length " +
                             std::to_string(d.length) + " overflows 64 bits");
  });
}

template <class V, Is<ChunkFile> M>
void Fields(V& v, M& c) {
  v.Int("chunk", c.chunk);
  v.WireStatus("status", c.status);
  v.Count("samples", c.samples, sf::kDirectSampleSize);
  v.Each("samples", c.samples, [&](auto& d) { Fields(v, d); });
  v.Count("elsewhere", c.elsewhere, sf::kIdSize);
  v.Each("elsewhere", c.elsewhere, [&](auto& id) { v.Int("", id); });
  v.Rule([&](std::string_view f) {
    if (c.status.ok() || c.samples.empty()) return Status::Ok();
    return FieldInvalid(f, "chunk " + std::to_string(c.chunk) + " failed (" +
                               std::string(StatusCodeName(c.status.code())) +
                               ") but lists samples to read from its file");
  });
}

template <class V, Is<ChunkFilesReply> M>
void Fields(V& v, M& m) {
  v.FitMessages(m.chunks, 4, sf::kChunkFileMinSize);
  v.Count("chunks", m.chunks, sf::kChunkFileMinSize);
  v.Rule([&](std::string_view) {
    size_t handed = 0;
    for (const auto& c : m.chunks) handed += c.status.ok() ? size_t{1} : size_t{0};
    if (handed <= sf::kMaxChunkFilesPerReply) return Status::Ok();
    return FieldRange("chunks",
                      std::to_string(handed) + " chunk files handed over, more than the " +
                          std::to_string(sf::kMaxChunkFilesPerReply) + " one reply may pass");
  });
  v.Each("chunks", m.chunks, [&](auto& c) { Fields(v, c); });
}

}  // namespace granary::sidecar_protocol::fields

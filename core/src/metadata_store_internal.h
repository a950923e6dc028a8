#pragma once

// What the two MetadataStore backends share, so they cannot disagree: input
// validation, the JSON documents records are stored as (docs/metadata-store.md),
// and message helpers. Private to granary_core.
//
// Thread safety: pure functions.

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "granary/core/metadata_store.h"
#include "granary/core/status.h"

namespace granary::store_internal {

// Accepted URL forms, quoted in every URL error.
inline constexpr std::string_view kAcceptedUrlForms =
    "redis://[[user]:password@]host[:port][/db][?prefix=NAME&timeout_ms=N&retry_ms=N] or "
    "sqlite:///absolute/path/granary.db[?retry_ms=N&poll_ms=N]";

// ---- validation ----
Status ValidatePoolName(std::string_view pool);
Status ValidateManifestId(std::string_view id);
Status ValidatePlanId(std::string_view id);
// Name, spec, owner, state and manifest id of a record about to be written.
Status ValidateDataset(const DatasetRecord& record);
Status ValidateNode(const NodeRecord& node, std::chrono::milliseconds ttl);
Status ValidatePlan(const PlanRecord& plan);

// ---- JSON documents ----
// A dataset document holds everything but `revision` and `created_ms`, which
// each backend keeps beside it (the revision is what its compare-and-set
// compares; created_ms must survive updates untouched). Encoding fails only on
// strings that are not valid UTF-8 (kInvalidArgument).
Result<std::string> EncodeDataset(const DatasetRecord& record);
// `where` names the record and the store for the kCorruption message.
Result<DatasetRecord> DecodeDataset(std::string_view json, uint64_t revision, int64_t created_ms,
                                    std::string_view where);

Result<std::string> EncodeNode(const NodeRecord& node);
Result<NodeRecord> DecodeNode(std::string_view json, std::string_view where);
// What makes a heartbeat a membership change worth an event: pool, address,
// capacity and incarnation (started_ms). used_bytes and heartbeat_ms are not.
std::string NodeIdentity(const NodeRecord& node);

Result<std::string> EncodeProgress(const StagingProgress& progress);
Result<StagingProgress> DecodeProgress(std::string_view json, std::string_view where);

Result<std::string> EncodePlan(const PlanRecord& plan);
Result<PlanRecord> DecodePlan(std::string_view json, std::string_view where);

std::string EncodeEvent(const Event& event);
Result<Event> DecodeEvent(std::string_view json);

// ---- messages ----
// `s` quoted for an error message: non-printable bytes escaped, long strings cut.
std::string Quote(std::string_view s);

// Milliseconds as "1.5 s" / "300 ms" for messages.
std::string FormatDuration(std::chrono::milliseconds d);

}  // namespace granary::store_internal

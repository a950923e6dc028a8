#pragma once

// What the two MetadataStore backends share, so they cannot disagree: input
// validation, the JSON documents records are stored as (docs/metadata-store.md),
// retry backoff, and message helpers. RecordStore (record_store.h) applies the
// validation and the documents for both. Private to granary_store (store/).
//
// Thread safety: the functions are pure; a Backoff belongs to the one call
// that made it.

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "granary/core/metadata_store.h"
#include "granary/core/status.h"

namespace granary::store_internal {

// Accepted URL forms, quoted in every URL error.
inline constexpr std::string_view kAcceptedUrlForms =
    "redis://[[user]:password@]host[:port][/db][?prefix=NAME&timeout_ms=N&retry_ms=N], "
    "redis+sentinel://[[user]:password@]sentinel[:port][,sentinel[:port]...]/MASTER[/db]"
    "[?prefix=NAME&timeout_ms=N&retry_ms=N&sentinel_password_file=PATH] or "
    "sqlite:///absolute/path/granary.db[?retry_ms=N&poll_ms=N]";

// ---- validation ----
// The names' rules (ValidatePoolName, ValidatePlanId, ...) are in names.h.
// Each is kInvalidArgument naming the field and the rule. The decoders below
// apply the same checks to what they read back, as kCorruption.
// Name, spec (include/exclude globs compile), owner, state and manifest id of
// a record about to be written.
Status ValidateDataset(const DatasetRecord& record);
// The record alone; Heartbeat adds the TTL check.
Status ValidateNode(const NodeRecord& node);
Status ValidateNodeTtl(std::string_view node_id, std::chrono::milliseconds ttl);
// Plan id, mode, and that the plan converts to a valid PlanSpec (ToPlanSpec).
Status ValidatePlan(const PlanRecord& plan);

// ---- JSON documents ----
// Encoding fails only on strings that are not valid UTF-8 (kInvalidArgument).
//
// Decoding trusts nothing: the text was written by another process, maybe
// another version, maybe by hand. Every field is type- and range-checked
// (integers are never narrowed or wrapped), the record is validated as on
// write, and its name must be the one its key says (`key_name`). Any failure is
// kCorruption: "decode <where>: <what is wrong>; ... rewrite or delete it".
// `where` names the record, the key it was read from and the store.
//
// A dataset document holds everything but `revision` and `created_ms`, which
// each backend keeps beside it (the revision is what its compare-and-set
// compares; created_ms must survive updates untouched); `revision` must be >= 1.
Result<std::string> EncodeDataset(const DatasetRecord& record);
Result<DatasetRecord> DecodeDataset(std::string_view json, std::string_view key_name,
                                    uint64_t revision, int64_t created_ms, std::string_view where);

Result<std::string> EncodeNode(const NodeRecord& node);
Result<NodeRecord> DecodeNode(std::string_view json, std::string_view key_id,
                              std::string_view where);
// What makes a heartbeat a membership change worth an event: pool, address,
// capacity and incarnation (started_ms). used_bytes and heartbeat_ms are not.
std::string NodeIdentity(const NodeRecord& node);

// Progress documents do not hold their node id: `key_node_id` (the hash field
// or row key) is checked as a node id instead.
Result<std::string> EncodeProgress(const StagingProgress& progress);
Result<StagingProgress> DecodeProgress(std::string_view json, std::string_view key_node_id,
                                       std::string_view where);

Result<std::string> EncodePlan(const PlanRecord& plan);
Result<PlanRecord> DecodePlan(std::string_view json, std::string_view key_plan_id,
                              std::string_view where);

std::string EncodeEvent(const Event& event);
Result<Event> DecodeEvent(std::string_view json);

// The kCorruption for a stored value at `where` that fails a check: the
// problem, and what to do about it.
Status CorruptRecord(std::string_view where, std::string_view problem);

// `s` as a decimal number of at most `max` (digits only, no sign): false for
// anything else. Ports, database numbers, milliseconds in URLs and records.
bool ParseDecimal(std::string_view s, uint64_t max, uint64_t* out);

// ---- retries ----

// Exponential backoff inside a budget measured on the steady clock: the Redis
// backend's reconnects, the SQLite backend's open.
class Backoff {
 public:
  static constexpr std::chrono::milliseconds kDefaultFirst{25};
  static constexpr std::chrono::milliseconds kDefaultMax{500};

  explicit Backoff(std::chrono::milliseconds budget,
                   std::chrono::milliseconds first = kDefaultFirst,
                   std::chrono::milliseconds max = kDefaultMax);
  explicit Backoff(std::chrono::steady_clock::time_point deadline);

  // Sleeps before the next attempt (never past the deadline); false, without
  // sleeping, once the budget is spent.
  bool Wait();
  bool first_attempt() const { return retries_ == 0; }
  std::chrono::milliseconds remaining() const;
  // "3 attempts in 1.2 s", for messages.
  std::string Summary() const;

 private:
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point deadline_;
  std::chrono::milliseconds delay_;
  std::chrono::milliseconds max_;
  int retries_ = 0;
};

// ---- messages ----

// Milliseconds as "1.5 s" / "300 ms" for messages.
std::string FormatDuration(std::chrono::milliseconds d);

}  // namespace granary::store_internal

// SnapshotDataset (snapshot.h): the snapshot of one dataset record: claiming
// it (phase Snapshotting, a compare-and-set), the walk as its owner
// (SnapshotAsOwner, snapshot_as_owner.cc), PutManifest, and the record's next
// phase, Staging or Failed with what to do, written only while the snapshot
// is still this one's.
#include "granary/source/snapshot.h"

#include <chrono>
#include <functional>
#include <string>
#include <utility>

#include "granary/core/config.h"
#include "granary/core/names.h"
#include "granary/source/posix_source.h"

namespace granary {
namespace {

using SteadyClock = std::chrono::steady_clock;

// Attempts of a read-modify-write of the record before giving up.
constexpr int kUpdateAttempts = 20;

// How messages name an owner (as snapshot_as_owner.cc does).
std::string OwnerText(const DatasetOwner& owner) {
  return "uid " + std::to_string(owner.uid) + " gid " + std::to_string(owner.gid);
}

}  // namespace

std::string_view SnapshotOutcomeName(SnapshotOutcome outcome) {
  switch (outcome) {
    case SnapshotOutcome::kSnapshotted:
      return "ok";
    case SnapshotOutcome::kFailed:
      return "failed";
    case SnapshotOutcome::kNotClaimed:
      return "not_claimed";
    case SnapshotOutcome::kSuperseded:
      return "superseded";
    case SnapshotOutcome::kAbandoned:
      return "abandoned";
  }
  return "unknown";
}

std::string SnapshotFailureMessage(const DatasetRecord& record, const Status& error,
                                   const std::string& claimant) {
  const std::string again = claimant.empty()
                                ? "then `granary dataset snapshot " + record.name + "`"
                                : "then ask for a new snapshot (`granary dataset snapshot " +
                                      record.name + "`, or set the phase to Pending)";
  std::string hint;
  switch (error.code()) {
    case StatusCode::kNotFound:
      hint = claimant.empty()
                 ? "check the path, " + again
                 : "check that the source is mounted at that path on the cache nodes of pool " +
                       record.spec.pool + " (a CachePool's sourceMounts), " + again;
      break;
    case StatusCode::kInvalidArgument:
      hint = "point the dataset at a directory, " + again;
      break;
    case StatusCode::kPermissionDenied:
      hint = "give uid " + std::to_string(record.owner.uid) +
             " read and search rights on the source (mode bits or an ACL), or make the "
             "dataset's owner a user who has them, " +
             again;
      break;
    default:
      hint = "fix the cause, " + again;
      break;
  }
  return "snapshot failed: source " + record.spec.source_uri + " as " + OwnerText(record.owner) +
         (claimant.empty() ? "" : " on node " + claimant) + ": " + error.message() + "; " + hint;
}

namespace {

// Whether `current` is still the snapshot taken by `claimant`.
bool StillClaimed(const DatasetRecord& current, const std::string& claimant) {
  return current.state.phase == DatasetPhase::kSnapshotting && current.state.claimed_by == claimant;
}

// The parts of a record a manifest is built from.
bool SameSnapshotInputs(const DatasetRecord& a, const DatasetRecord& b) {
  return a.spec.source_uri == b.spec.source_uri && a.spec.include == b.spec.include &&
         a.spec.exclude == b.spec.exclude && a.spec.chunk_size == b.spec.chunk_size &&
         a.owner == b.owner;
}

enum class WriteResult { kWritten, kNotOurs };

// Re-reads the record and, while it is still this snapshot's, applies
// `change` with compare-and-set (re-reading on a conflict).
Result<WriteResult> WriteIfClaimed(MetadataStore& store, const std::string& name,
                                   const std::string& claimant,
                                   const std::function<void(DatasetRecord&)>& change,
                                   DatasetRecord* written) {
  for (int attempt = 0; attempt < kUpdateAttempts; ++attempt) {
    Result<DatasetRecord> current = store.GetDataset(name);
    if (!current.ok()) {
      if (current.status().code() == StatusCode::kNotFound) return WriteResult::kNotOurs;
      return current.status();
    }
    if (!StillClaimed(*current, claimant)) {
      *written = *current;
      return WriteResult::kNotOurs;
    }
    change(*current);
    Result<DatasetRecord> updated = store.UpdateDataset(*current);
    if (updated.ok()) {
      *written = *updated;
      return WriteResult::kWritten;
    }
    if (updated.status().code() == StatusCode::kNotFound) return WriteResult::kNotOurs;
    if (updated.status().code() != StatusCode::kFailedPrecondition) return updated.status();
  }
  return Status::FailedPrecondition("dataset " + Quoted(name) +
                                    " kept changing under the snapshot's update; take it again");
}

}  // namespace

Result<DatasetSnapshot> SnapshotDataset(MetadataStore& store, const DatasetRecord& record,
                                        const DatasetSnapshotOptions& options) {
  const std::string& claimant = options.claimant;
  const bool node = !claimant.empty();
  const std::string what = "snapshot of dataset " + Quoted(record.name);
  DatasetSnapshot out;
  const std::string walking =
      node ? "node " + claimant + " is walking the source as " + OwnerText(record.owner)
           : "walking the source to build the manifest";

  // 1. Claim: phase Snapshotting.
  DatasetRecord claimed = record;
  for (int attempt = 0;; ++attempt) {
    DatasetRecord change = claimed;
    change.state = {DatasetPhase::kSnapshotting, walking, claimant};
    Result<DatasetRecord> updated = store.UpdateDataset(change);
    if (updated.ok()) {
      claimed = *updated;
      break;
    }
    if (updated.status().code() != StatusCode::kFailedPrecondition) {
      return updated.status().WithContext(what + ": setting phase Snapshotting");
    }
    if (node) {
      out.outcome = SnapshotOutcome::kNotClaimed;
      out.record = record;
      return out;
    }
    if (attempt + 1 >= kUpdateAttempts) {
      return Status::FailedPrecondition("dataset " + Quoted(record.name) +
                                        " kept changing under this update; try again");
    }
    GRANARY_ASSIGN_OR_RETURN(claimed, store.GetDataset(record.name));
  }
  out.record = claimed;

  // 2. Walk.
  GRANARY_ASSIGN_OR_RETURN(std::string root, PosixSource::RootFromUri(claimed.spec.source_uri));
  ManifestBuildOptions build;
  build.source_root = root;
  build.source_uri = claimed.spec.source_uri;
  build.include = claimed.spec.include;
  build.exclude = claimed.spec.exclude;
  build.chunk_size = claimed.spec.chunk_size;
  build.threads = options.walk_threads;
  uint64_t files_seen = 0;
  uint64_t dirs_seen = 0;
  build.on_progress = [&](uint64_t files, uint64_t dirs) {
    files_seen = files;
    dirs_seen = dirs;
    if (options.on_progress) options.on_progress(files, dirs);
  };
  bool stopped = false;
  bool superseded = false;
  auto next_check = SteadyClock::now() + options.check_interval;
  auto next_progress = SteadyClock::now() + options.progress_interval;
  uint64_t files_written = 0;
  SnapshotProcess process = options.process;
  process.keep_going = [&]() {
    if (options.stop != nullptr && options.stop->load()) {
      stopped = true;
      return false;
    }
    if (!node || SteadyClock::now() < next_check) return true;
    next_check = SteadyClock::now() + options.check_interval;
    Result<DatasetRecord> current = store.GetDataset(claimed.name);
    if (!current.ok()) {
      // Deleted: nobody wants the result. Unreachable: keep walking; the
      // final write decides.
      superseded = current.status().code() == StatusCode::kNotFound;
      return !superseded;
    }
    if (!StillClaimed(*current, claimant) || !SameSnapshotInputs(*current, claimed)) {
      superseded = true;
      return false;
    }
    if (files_seen != files_written && SteadyClock::now() >= next_progress) {
      next_progress = SteadyClock::now() + options.progress_interval;
      current->state.message = walking + ": " + std::to_string(files_seen) + " files, " +
                               std::to_string(dirs_seen) + " directories so far";
      // A conflict only means someone else wrote: the next check looks again.
      if (store.UpdateDataset(*current).ok()) files_written = files_seen;
    }
    return true;
  };
  const auto start = SteadyClock::now();
  Result<Manifest> manifest = SnapshotAsOwner(claimed.owner, build, process);
  out.seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();

  if (stopped) {
    // 3a. Stopping: give the claim back so another node takes it at once.
    out.outcome = SnapshotOutcome::kAbandoned;
    GRANARY_ASSIGN_OR_RETURN(
        WriteResult w, WriteIfClaimed(
                           store, claimed.name, claimant,
                           [&](DatasetRecord& r) {
                             r.state = {DatasetPhase::kPending,
                                        (node ? "node " + claimant : std::string("the client")) +
                                            " stopped during the snapshot; it is taken again",
                                        ""};
                           },
                           &out.record));
    (void)w;
    return out;
  }
  if (superseded) {
    // Still this claim, but the spec or the owner changed: give it back, so
    // that it is taken again from the new inputs.
    out.outcome = SnapshotOutcome::kSuperseded;
    GRANARY_ASSIGN_OR_RETURN(WriteResult w, WriteIfClaimed(
                                                store, claimed.name, claimant,
                                                [&](DatasetRecord& r) {
                                                  r.state = {
                                                      DatasetPhase::kPending,
                                                      "the spec changed during the snapshot; it is "
                                                      "taken again",
                                                      ""};
                                                },
                                                &out.record));
    (void)w;
    return out;
  }

  // 3b. The record must still be this snapshot's, with the inputs it was
  // taken from; otherwise the result is dropped.
  auto finish = [&](const std::function<void(DatasetRecord&)>& change) -> Result<bool> {
    bool inputs_changed = false;
    GRANARY_ASSIGN_OR_RETURN(WriteResult w, WriteIfClaimed(
                                                store, claimed.name, claimant,
                                                [&](DatasetRecord& r) {
                                                  inputs_changed =
                                                      node && !SameSnapshotInputs(r, claimed);
                                                  if (inputs_changed) {
                                                    r.state = {DatasetPhase::kPending,
                                                               "the spec changed during the "
                                                               "snapshot; it is taken again",
                                                               ""};
                                                  } else {
                                                    change(r);
                                                  }
                                                },
                                                &out.record));
    return w == WriteResult::kWritten && !inputs_changed;
  };

  if (!manifest.ok()) {
    out.error = manifest.status();
    const std::string message = SnapshotFailureMessage(claimed, manifest.status(), claimant);
    GRANARY_ASSIGN_OR_RETURN(bool written, finish([&](DatasetRecord& r) {
                               r.state = {DatasetPhase::kFailed, message, ""};
                             }));
    out.outcome = written ? SnapshotOutcome::kFailed : SnapshotOutcome::kSuperseded;
    return out;
  }

  out.manifest_id = manifest->id().ToHex();
  out.files = manifest->sample_count();
  out.bytes = manifest->total_bytes();
  out.chunks = manifest->chunk_count();
  out.summary = std::to_string(out.files) + " files, " + HumanBytes(out.bytes) + ", " +
                std::to_string(out.chunks) + " chunks";
  // Links the source's reads would refuse are not samples: say how many were
  // left out, so a missing file is explained here rather than found later.
  if (const uint64_t links = manifest->header().stats.skipped_symlinks; links > 0) {
    out.summary += "; " + std::to_string(links) + " symbolic link" + (links == 1 ? "" : "s") +
                   " left out (absolute, leaving the source, to a directory, a loop or dangling)";
  }
  Status put = store.PutManifest(out.manifest_id, manifest->Encode());
  if (!put.ok() && put.code() == StatusCode::kUnavailable) {
    return put.WithContext(what + ": storing manifest " + out.manifest_id);
  }
  if (!put.ok()) {
    // Refused for good (e.g. larger than kMaxManifestBytes): taking the
    // snapshot again would not help.
    out.error = Status(StatusCode::kResourceExhausted,
                       "the store refused the manifest (" + out.summary + "): " + put.message());
    const std::string message = SnapshotFailureMessage(claimed, out.error, claimant);
    GRANARY_ASSIGN_OR_RETURN(bool written, finish([&](DatasetRecord& r) {
                               r.state = {DatasetPhase::kFailed, message, ""};
                             }));
    out.outcome = written ? SnapshotOutcome::kFailed : SnapshotOutcome::kSuperseded;
    return out;
  }
  GRANARY_ASSIGN_OR_RETURN(bool written, finish([&](DatasetRecord& r) {
                             r.manifest_id = out.manifest_id;
                             r.state = {DatasetPhase::kStaging, "snapshot: " + out.summary, ""};
                           }));
  out.outcome = written ? SnapshotOutcome::kSnapshotted : SnapshotOutcome::kSuperseded;
  return out;
}

}  // namespace granary

#pragma once

// Taking a dataset's snapshot (the manifest, DESIGN.md "Manifest") with the
// rights of the dataset's owner, and recording it in the metadata store.
//
//   SnapshotAsOwner  walks a source as a DatasetOwner and returns the Manifest.
//                    When the caller is root and the owner is someone else, the
//                    walk runs in a child process that has become the owner
//                    (setgroups/setgid/setuid), so a snapshot never lists what
//                    the owner could not list; the child sends its progress
//                    and the encoded manifest back over a pipe.
//   SnapshotDataset  the whole snapshot of one dataset record: phase
//                    Snapshotting (a compare-and-set: with a claimant, one
//                    claimant wins), the walk, PutManifest, then Staging with
//                    "snapshot: N files, X, K chunks[; L symbolic links left
//                    out (...)]", or Failed with
//                    "snapshot failed: <reason>" naming the source, the uid and
//                    what to do.
//
// Callers: `granary dataset create|snapshot|stage` (cli/src/dataset_command.cc)
// for SnapshotBy::kClient datasets; the cache node's snapshot thread
// (cachenode/src/cache_node.cc) for SnapshotBy::kPool datasets; and
// `granary-cachenode --snapshot-child`, the helper a cache node spawns, which
// calls RunSnapshotChild.
//
// How the child is made (SnapshotProcess):
//   - fork() alone (helper_argv empty): the child walks right after the fork.
//     Only for a single-threaded caller (the CLI): a fork copies only the
//     calling thread, so any lock another thread held at that moment (the
//     logger's sink mutex, the log registry's, NSS's) stays locked forever in
//     the child, and BuildManifest logs (the first entry it cannot read) and
//     takes the log registry's lock (GetLogger).
//   - posix_spawn of a helper (helper_argv set, e.g. {"/proc/self/exe",
//     "--snapshot-child"}): a fresh process that calls RunSnapshotChild and
//     reads its request (owner, groups, walk options) as JSON on stdin. For
//     multi-threaded daemons (the cache node). glibc's posix_spawn uses
//     clone(CLONE_VFORK) and runs nothing of the parent's between the clone and
//     the exec, so it is safe whatever the parent's other threads hold. With a
//     helper the walk always runs in the child, even without an identity
//     switch, so that it can be abandoned (killed) at any moment.
// The child sets PR_SET_PDEATHSIG (SIGKILL) once it is the owner, so it never
// outlives the thread that waits for it (a cache node killed with SIGKILL
// leaves no walk behind).
//
// The source path must pass through no symbolic link: checked as the owner,
// and the root is opened without following any (docs/source-and-identity.md,
// "Source paths and symbolic links").
//
// Without privileges (euid != 0) a process can only walk as itself: an owner
// whose uid is not the effective uid is refused with kPermissionDenied.
//
// Thread safety: SnapshotAsOwner and SnapshotDataset may run on any thread
// and concurrently; each call blocks its thread until the walk is over.
// The callbacks run on the calling thread (on_progress on a walker thread when
// the walk runs in this process).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "granary/core/manifest.h"
#include "granary/core/manifest_builder.h"
#include "granary/core/metadata_store.h"
#include "granary/core/status.h"

namespace granary {

struct SnapshotProcess {
  // Empty: fork() (single-threaded callers only, see above). Otherwise the
  // program and arguments of the helper, which must call RunSnapshotChild(0, 1).
  std::vector<std::string> helper_argv;
  // Polled about every 100 ms while a child walks; returning false kills the
  // child and makes SnapshotAsOwner return kUnavailable ("abandoned"). Not
  // consulted when the walk runs in this process (no child).
  std::function<bool()> keep_going;
};

// The manifest of options.source_root, walked with the rights of `owner`.
// Errors: the walk's (kNotFound: the root does not exist; kInvalidArgument:
// not a directory; kPermissionDenied: the owner may not read it, or this
// process may not become the owner), kUnavailable when keep_going stopped it,
// kInternal when the child ended without an answer (killed, crashed).
Result<Manifest> SnapshotAsOwner(const DatasetOwner& owner, ManifestBuildOptions options,
                                 const SnapshotProcess& process = {});

// The body of the helper process: reads the request from `in_fd` (to end of
// file), becomes the owner, walks, writes progress and the manifest (or the
// error) to `out_fd`. Returns the process's exit status (0 once an answer was
// written).
int RunSnapshotChild(int in_fd, int out_fd);

// ---- the snapshot of a dataset record -------------------------------------------

enum class SnapshotOutcome : uint8_t {
  kSnapshotted,  // manifest stored; the record is Staging with its id
  kFailed,       // the walk failed; the record is Failed with the reason
  kNotClaimed,   // a claimant: another one changed the record first; nothing done
  kSuperseded,   // the record changed during the walk (a new snapshot asked, the
                 // spec changed, deleted, or claimed by another node): result dropped
  kAbandoned,    // `stop` was set: the walk was killed and the claim released
};
std::string_view SnapshotOutcomeName(SnapshotOutcome outcome);  // "ok", "failed", ...

struct DatasetSnapshotOptions {
  // The cache node taking the snapshot, recorded in DatasetState::claimed_by;
  // empty for a client (the CLI), which does not compete for the record.
  std::string claimant;
  unsigned walk_threads = 8;  // ManifestBuildOptions::threads
  SnapshotProcess process;    // its keep_going is replaced (see `stop`)
  // Files and directories seen so far, on the calling thread (or a walker
  // thread for a walk in this process).
  std::function<void(uint64_t files, uint64_t directories)> on_progress;
  // Set (by another thread) to abandon the walk: the child is killed and the
  // record set back to Pending if it is still this claimant's.
  const std::atomic<bool>* stop = nullptr;
  // A claimant re-reads the record this often during the walk: if it is not
  // its claim any more, the walk is abandoned as superseded. It also writes
  // the progress into the message, at most every progress_interval.
  std::chrono::milliseconds check_interval{2000};
  std::chrono::milliseconds progress_interval{10000};
};

struct DatasetSnapshot {
  SnapshotOutcome outcome = SnapshotOutcome::kNotClaimed;
  DatasetRecord record;  // the record as last written or read
  Status error;          // kFailed: why (the reason in the record's message)
  std::string manifest_id;
  uint64_t files = 0;
  uint64_t bytes = 0;
  uint64_t chunks = 0;
  double seconds = 0;   // the walk's
  std::string summary;  // "N files, X, K chunks"
};

// Takes the snapshot of `record` (as read, with its revision) and records it.
// A claimant's first write is a compare-and-set on record.revision: losing it
// is kNotClaimed. A client re-reads and retries a conflict (a cache node may be
// writing the message). The result is written only if the record is still
// this snapshot's (phase Snapshotting, claimed_by == claimant); a claimant
// whose record's spec or owner changed during the walk sets it back to
// Pending. Errors are the store's (the claim, PutManifest, the final write):
// the record may then be left Snapshotting by this claimant, which a cache
// node takes up again on its next pass.
Result<DatasetSnapshot> SnapshotDataset(MetadataStore& store, const DatasetRecord& record,
                                        const DatasetSnapshotOptions& options);

// "snapshot failed: source file:///x as uid U gid G[ on node N]: <error>; <what
// to do>" for a walk of `record` that failed with `error`.
std::string SnapshotFailureMessage(const DatasetRecord& record, const Status& error,
                                   const std::string& claimant);

}  // namespace granary

#pragma once

// The `#DW` burst-buffer directives of a Slurm job script (docs/slurm.md):
// what Granary supports of Cray DataWarp's syntax, parsed and checked the way
// `sbatch` needs them: every problem with its line number and what to write
// instead, all of them at once, so a user fixes a script in one round.
//
//   #DW jobdw type=scratch access_mode=striped capacity=<size> pool=<pool>
//   #DW stage_in type=directory source=/abs/dir destination=$DW_JOB_STRIPED/<name>
//   #DW persistentdw name=<dataset>
//
// ParseJobDirectives is pure (the syntax and the rules that need nothing but
// the script); CheckJobDirectives adds the rules that look at the world: the
// source directories on this host, the pools with live cache nodes and the
// datasets in the metadata store.
//
// Who calls it: `granary slurm validate` (slurm_command.cc), which
// burst_buffer.lua's slurm_bb_job_process runs inside slurmctld at submit
// time, and the later `granary slurm` steps, which re-read the script.
//
// Thread safety: pure functions over their arguments (CheckJobDirectives
// calls the store, which is thread-safe).

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "granary/core/metadata_store.h"
#include "granary/core/status.h"

namespace granary::cli {

// The prefix of a job-scoped stage_in destination; the rest is one name.
inline constexpr std::string_view kJobStripedVariable = "$DW_JOB_STRIPED";
// A stage_in name becomes the dataset "slurm-<job id>-<name>" (JobDatasetName),
// a DNS label of at most 63 bytes; job ids have at most 10 digits.
inline constexpr std::string_view kJobDatasetPrefix = "slurm-";
inline constexpr size_t kMaxStageInNameLength = 63 - 6 - 10 - 1;

struct JobDwDirective {
  int line = 0;
  uint64_t capacity_bytes = 0;
  std::string pool;  // required: Slurm 22.05 refuses capacity= without pool=
};

struct StageInDirective {
  int line = 0;
  std::string source;  // absolute directory
  std::string name;    // the part after $DW_JOB_STRIPED/
};

struct PersistentDwDirective {
  int line = 0;
  std::string name;  // an existing dataset
};

struct JobDirectives {
  std::optional<JobDwDirective> jobdw;
  std::vector<StageInDirective> stage_ins;
  std::vector<PersistentDwDirective> persistent;

  bool empty() const { return !jobdw && stage_ins.empty() && persistent.empty(); }
};

struct DirectiveError {
  int line = 0;        // 1-based line of the script
  std::string reason;  // what is wrong and what to write instead

  // "line 7: #DW stage_in: source= is missing; ..."
  std::string ToString() const;
};

struct DirectiveParse {
  JobDirectives directives;
  std::vector<DirectiveError> errors;  // in line order
};

// Reads every line that starts with "#DW" followed by white space (or
// nothing) and applies the rules that need only the script.
DirectiveParse ParseJobDirectives(std::string_view script);

// Adds to `parse.errors` (kept in line order) what the world says: a source
// that does not exist or is not a directory (a source this user may not look
// at is left to the job's user at setup), a pool= no live cache node is in,
// a persistentdw dataset the store does not have. A store that cannot be
// read is the returned Status (nothing can be decided without it). `store`
// may be null when !NeedsStore(parse.directives).
Status CheckJobDirectives(DirectiveParse& parse, MetadataStore* store);
// Whether CheckJobDirectives asks the store (a jobdw's pool or a persistentdw).
bool NeedsStore(const JobDirectives& directives);

// "slurm-<job_id>-<name>": the dataset a stage_in directive makes for a job.
// kInvalidArgument unless job_id is 1..10 digits and the result is a DNS label.
Result<std::string> JobDatasetName(std::string_view job_id, std::string_view name);

}  // namespace granary::cli

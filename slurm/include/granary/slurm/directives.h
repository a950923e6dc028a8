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

namespace granary::slurm {

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
  // source= or destination= holds %j and the job id was not given (validate):
  // source and name then hold a 10-digit stand-in for the id (they were
  // checked with it), the *_written fields the values as written (for
  // showing), and the source is not looked at.
  bool symbolic = false;
  std::string source_written;  // "/lustre/run-%j"; empty unless symbolic
  std::string name_written;    // "data-%j"; empty unless symbolic
};

struct PersistentDwDirective {
  int line = 0;
  std::string name;          // an existing dataset
  bool symbolic = false;     // holds %j with no job id (see StageInDirective)
  std::string name_written;  // "ckpt-%j"; empty unless symbolic
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

// How the '%' symbols Slurm replaces in burst-buffer lines are read.
//
// Slurm (src/plugins/burst_buffer/common/burst_buffer_common.c,
// bb_handle_job_script/_handle_replacement) gives slurm_bb_setup and
// slurm_bb_data_in, when a #DW line holds a '%', a copy of the script's
// merged #DW lines under "#!/bin/sh" with %% %A %a %d %j %u %x replaced, as
// /proc/<slurmctld pid>/fd/<n> (a memfd); slurm_bb_job_process,
// slurm_bb_paths, the teardown and `scontrol write batch_script` (the node
// prolog) get the script as submitted.
struct ScriptSymbols {
  // What %j stands for. Empty (validate): %j is checked with a 10-digit
  // stand-in (the directives holding it are marked symbolic).
  std::string job_id;
  // The script is Slurm's replaced copy: a '%' in it is a literal '%'.
  bool replaced = false;
};

// Reads every line that starts with "#DW" followed by white space (or
// nothing) and applies the rules that need only the script. A #DW line
// ending in '\' goes on on the next #DW line, as Slurm merges them
// (burst_buffer_lua.c, _xlate_batch); the directive keeps its first line's
// number. In source=, destination= and persistentdw name=, %% is a '%' and %j
// the job id; every other '%' is an error that says why.
DirectiveParse ParseJobDirectives(std::string_view script, const ScriptSymbols& symbols = {});

// Whether a script path Slurm passed is its symbol-replaced copy
// (/proc/<pid>/fd/<n>) rather than the script as submitted.
bool IsSlurmReplacedScript(std::string_view path);

// The script with %j in its #DW lines replaced by `job_id` and everything
// else (%% included) as it was, for a step that parses it without the job id
// (the node prolog reads `scontrol write batch_script`).
std::string ReplaceJobIdSymbols(std::string_view script, std::string_view job_id);

// The user a job runs as: its uid and gid (Slurm's) and the supplementary
// groups the user database lists for it (ResolveJobUser, node_agent.h).
struct JobUser {
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::vector<uint32_t> groups;
  std::string name;  // for messages; may be empty
};

// Why `user` may not read the persistentdw dataset `dataset`, with the fix;
// empty when it may (MayReadDataset: root, the owner, or a granted reader).
// The job's sidecar runs as root, so this is the only check between a job and
// another user's staged bytes (docs/security.md, "Who may read a dataset").
std::string PersistentDwRefusal(const DatasetRecord& dataset, const JobUser& user);

// The record of persistentdw directive `p` of job `job_id`, read from `store`
// and checked for `user`: the store's error (kNotFound for a dataset not
// there) with the job and line, or kPermissionDenied with the refusal.
// What setup and the prolog both run.
Result<DatasetRecord> PersistentDwDataset(MetadataStore& store, const PersistentDwDirective& p,
                                          const JobUser& user, std::string_view job_id);

// Adds to `parse.errors` (kept in line order) what the world says: a source
// that does not exist or is not a directory (a source this user may not look
// at is left to the job's user at setup), a pool= no live cache node is in,
// a persistentdw dataset the store does not have, or (given `user`) one that
// user may not read. A store that cannot be read is the returned Status
// (nothing can be decided without it). `store` may be null when
// !NeedsStore(parse.directives).
Status CheckJobDirectives(DirectiveParse& parse, MetadataStore* store,
                          const JobUser* user = nullptr);
// Whether CheckJobDirectives asks the store (a jobdw's pool or a persistentdw).
bool NeedsStore(const JobDirectives& directives);

// "slurm-<job_id>-<name>": the dataset a stage_in directive makes for a job.
// kInvalidArgument unless job_id is 1..10 digits and the result is a DNS label.
Result<std::string> JobDatasetName(std::string_view job_id, std::string_view name);

}  // namespace granary::slurm

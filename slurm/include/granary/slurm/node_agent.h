#pragma once

// The node side of a Slurm job with #DW directives (docs/slurm.md, "The
// node side"): what slurm/plugin/prolog.sh and epilog.sh run on every node
// of the job, as root, through `granary slurm prolog|epilog`.
//
// SlurmProlog, before any task of the job starts (PrologFlags=Alloc):
//   - finds the job's datasets: its stage_in datasets `slurm-<job>-<name>`
//     in the store (made by `granary slurm setup`), checked against the job
//     script's directives (--script, which prolog.sh fetches with `scontrol
//     write batch_script`), and its persistentdw datasets, each of which the
//     job's user must be allowed to read (PersistentDwRefusal); a job without #DW
//     directives is left alone without asking the store, and so is a job
//     with no script (not a batch job) when the store cannot be asked;
//   - places each stage_in dataset on this host's cache node too (setup
//     made them on no node: while the job is pending they are only
//     snapshotted; from its start they are staged onto the job's nodes, in
//     the order of the plans its training registers), adding the node to
//     the dataset's node list (DatasetSpec::nodes) as every node's prolog
//     does;
//   - starts one granary-sidecar for the job, as root in a session of its
//     own, serving the job's datasets (its `datasets:` option: no other
//     dataset of the pool) on <job-root>/job-<job>.sock and mounting
//     each stage_in dataset read-only at <job-root>/job-<job>/<name> (its
//     `mounts:` option; the views show the dataset owner, the job's user);
//   - waits, up to --timeout, until the sidecar's /readyz answers 200 (every
//     view mounted), then gives the socket to the job's uid:gid;
//   - on any failure, removes what it made (as SlurmEpilog does) and returns
//     the reason with the sidecar log's tail.
// SlurmEpilog, after the job: stops that sidecar (SIGTERM, then SIGKILL
// after --timeout), lazily unmounts anything still mounted under the job's
// directory (a sidecar that crashed leaves a dead mount), and removes the
// mount points, the job's directory, the socket and the prolog's state
// (<job-root>/.job-<job>/: the sidecar's config and pid). Idempotent: what is
// already gone is skipped, so Slurm may run it again, or after a prolog that
// failed half-way.
//
// The sidecar's log is <log-dir>/slurm-job-<job>-sidecar.log (kept).
//
// Who calls them: the CLI's `granary slurm prolog|epilog`
// (cli/src/slurm_command.cc), through a NodeAgentContext over its own.
//
// Thread safety: one thread (the command's); both fork/exec or signal
// processes and change the file system under --job-root.

#include <ostream>
#include <string>

#include "granary/core/metadata_store.h"
#include "granary/core/status.h"
#include "granary/slurm/directives.h"

namespace granary::slurm {

struct SlurmNodeOptions {
  std::string job_id;
  std::string uid;     // the job's user (SLURM_JOB_UID)
  std::string gid;     // and group (SLURM_JOB_GID)
  std::string script;  // the job script; empty: not known (not a batch job)
  std::string job_root = "/run/granary/slurm";
  std::string sidecar_binary = "/usr/bin/granary-sidecar";
  std::string log_dir = "/var/log/granary";
  std::string timeout = "60s";
  // prolog: this host's cache node id (empty: $SLURMD_NODENAME, else the
  // host name), added to the nodes of the job's stage_in datasets.
  std::string node;
};

// What the node agent takes from its caller: where to report, the metadata
// store, and what the job's sidecar is configured with to reach the cache
// nodes (the same store, cluster key and TLS CA as the caller's).
class NodeAgentContext {
 public:
  virtual ~NodeAgentContext() = default;
  virtual std::ostream& out() = 0;
  // Opens the store (once); store() is valid after it returned OK.
  virtual Status OpenStore() = 0;
  virtual MetadataStore& store() = 0;
  virtual std::string StoreUrl() const = 0;
  // The cluster key file the sidecar is given, or empty for none; and
  // whether it loads (an error naming the file and the fix if not).
  virtual std::string ClusterKeyPath() const = 0;
  virtual Status CheckClusterKey() const = 0;
  // The CA the sidecar checks nodes' TLS certificates with, or empty.
  virtual std::string TlsCaPath() const = 0;
};

// A uid or gid as Slurm passes it (decimal); `what` names it in the error.
Result<uint32_t> ParseUserOrGroupId(const std::string& text, const std::string& what);

// The job's user as the user database knows it (its supplementary groups,
// for the grants of persistentdw datasets); a uid it does not know has no
// group but `gid`. kUnavailable when the user database fails (retry).
Result<JobUser> ResolveJobUser(uint32_t uid, uint32_t gid);

Status SlurmProlog(NodeAgentContext& c, const SlurmNodeOptions& o);
Status SlurmEpilog(NodeAgentContext& c, const SlurmNodeOptions& o);

}  // namespace granary::slurm

#pragma once

// SlurmCluster: a real one-node Slurm (munged, slurmctld, slurmd from the
// distribution's packages) on 127.0.0.1, for the Slurm integration suites
// (tests/integration/slurm_cluster_test.cc).
//
//   std::string why;
//   if (!SlurmCluster::Available(&why)) GTEST_SKIP() << why;
//   SlurmClusterOptions o;
//   o.granary_binary = ...; o.sidecar_binary = ...; o.store_url = ...;
//   o.plugin_dir = "<source>/slurm/plugin";
//   auto slurm = SlurmCluster::Start(o);              // waits until the node is idle
//   auto job = (*slurm)->Submit(script_path);          // sbatch as the submitting user
//   auto state = (*slurm)->WaitForJobState(*job, {"COMPLETED", "FAILED"}, 60s);
//   auto fields = (*slurm)->ShowJob(*job);             // scontrol show job, as a map
//
// Everything lives in a TempDir (mode 0755, so the submitting user can reach
// what the test puts there): the munge key and socket, slurm.conf,
// burst_buffer.conf, burst_buffer.lua and the node's prolog.sh/epilog.sh
// (copied from slurm/plugin/ with their settings block pointing at the
// build's granary binary, the sidecar binary, the test's store and a job root
// in the TempDir), the controller's state, the node's spool, the daemons'
// logs, and `out/` (mode 0777) for the jobs' output files. Ports are free
// loopback ports. The daemons run in the foreground under DaemonProcess
// (killed with the test; their logs are printed if the test fails). Jobs are
// submitted by a non-root user (root cannot submit burst-buffer jobs): uid
// and gid 65534 (nobody) by default, through setpriv.
//
// Every wait is bounded. Start fails (kUnavailable, with the daemons' logs'
// tails) if the node is not idle within its deadline.
//
// Thread safety: the test's main thread owns the cluster; no method may be
// called from two threads at once.

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "granary/core/status.h"
#include "testing/daemon_process.h"
#include "testing/test_util.h"

namespace granary::testing {

struct SlurmClusterOptions {
  std::string granary_binary;    // the CLI the plugin and the prolog/epilog run
  std::string sidecar_binary;    // what the prolog starts per job
  std::string store_url;         // the metadata store the cache nodes use
  std::string plugin_dir;        // the source tree's slurm/plugin/
  std::string cache_node_id;     // NODE in prolog.sh: the cache node of this host (empty: unset)
  std::string cluster_key_file;  // CLUSTER_KEY in prolog.sh (empty: granary's default)
  uint32_t user_uid = 65534;     // who submits jobs
  uint32_t user_gid = 65534;
  std::string stage_in_timeout = "120";  // burst_buffer.conf StageInTimeout, seconds
  std::chrono::milliseconds start_timeout{60000};
};

// What a Slurm client command (sbatch, scontrol, ...) did.
struct SlurmCommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

class SlurmCluster {
 public:
  // Whether the Slurm and munge binaries are installed; if not, `why` says
  // which is missing (for GTEST_SKIP).
  static bool Available(std::string* why);

  static Result<std::unique_ptr<SlurmCluster>> Start(SlurmClusterOptions options);

  // Cancels what is still queued (bounded wait), then stops slurmd,
  // slurmctld and munged.
  ~SlurmCluster();
  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  const std::string& dir() const { return dir_.path(); }
  std::string conf_path() const { return dir_.Join("slurm.conf"); }
  // Where the prolog puts the jobs' directories and sidecar sockets
  // (granary slurm prolog --job-root).
  std::string job_root() const { return dir_.Join("jobs"); }
  // Where jobs may write their output (mode 0777).
  std::string out_dir() const { return dir_.Join("out"); }
  // The node's name in slurm.conf (this host's name).
  const std::string& node_name() const { return node_name_; }

  // Runs a Slurm client command with SLURM_CONF set: as the submitting user
  // if `as_user`, else as root. kDeadlineExceeded if it does not end in time.
  Result<SlurmCommandResult> Run(const std::vector<std::string>& argv, bool as_user,
                                 std::chrono::milliseconds timeout = std::chrono::seconds(30));

  // sbatch as the submitting user: the job id, or kInvalidArgument with what
  // sbatch said.
  Result<std::string> Submit(const std::string& script_path,
                             const std::vector<std::string>& sbatch_args = {});

  // `scontrol show job -o JOB` as key -> value (the last value of a key that
  // repeats); kNotFound once the job is gone from the controller.
  Result<std::map<std::string, std::string>> ShowJob(const std::string& job_id);

  // Waits until the job's JobState is one of `states`: the fields then. At the
  // deadline kDeadlineExceeded with the last state and reason.
  Result<std::map<std::string, std::string>> WaitForJobState(const std::string& job_id,
                                                             const std::set<std::string>& states,
                                                             std::chrono::milliseconds timeout);

  // The node's state as sinfo shows it ("idle", "drain", ...).
  Result<std::string> NodeState();

  // The last `max_bytes` of slurmctld's and slurmd's logs, for messages.
  std::string LogTails(size_t max_bytes = 4096) const;

 private:
  explicit SlurmCluster(SlurmClusterOptions options);
  Status WriteFiles();
  Status StartDaemons();

  SlurmClusterOptions options_;
  TempDir dir_;
  std::string node_name_;
  std::unique_ptr<DaemonProcess> munged_;
  std::unique_ptr<DaemonProcess> slurmctld_;
  std::unique_ptr<DaemonProcess> slurmd_;
  int commands_run_ = 0;  // names each command's output file
};

}  // namespace granary::testing

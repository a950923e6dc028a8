// `granary slurm <step> ...`: what slurm/plugin/burst_buffer.lua runs for
// Slurm's burst_buffer/lua functions, so that the logic lives here, in
// tested C++, and the Lua stays a thin dispatcher (docs/slurm.md).
//
//   granary slurm validate SCRIPT [--uid U --gid G]
//                                   slurm_bb_job_process: the script's #DW
//                                   directives, each problem with its line;
//                                   with the user (23.02+), its right to
//                                   read each persistentdw dataset
//   granary slurm pools             slurm_bb_pools: capacity per pool (JSON)
//   granary slurm setup JOB UID GID SCRIPT
//                                   slurm_bb_setup: the job's stage_in
//                                   datasets, owned by the job's user; its
//                                   right to read each persistentdw dataset
//   granary slurm data_in JOB SCRIPT
//                                   slurm_bb_data_in: snapshots them; waits
//                                   until every dataset of the job is usable
//   granary slurm paths JOB SCRIPT PATH_FILE
//                                   slurm_bb_paths: the job's environment
//   granary slurm teardown JOB      slurm_bb_job_teardown: deletes the job's
//                                   datasets (idempotent); persistent ones stay
//   granary slurm prolog JOB --uid U --gid G [--script FILE]
//                                   the node's Prolog (slurm/plugin/prolog.sh):
//                                   the job's sidecar and views (granary/slurm/node_agent.h)
//   granary slurm epilog JOB        the node's Epilog: all of it gone
//
// setup and data_in run the `granary dataset` commands in-process (RunCli),
// so a job's dataset is made exactly as a user's is.

#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli_context.h"
#include "granary/cli/cli.h"
#include "granary/core/config.h"
#include "granary/core/file.h"
#include "granary/core/names.h"
#include "granary/slurm/directives.h"
#include "granary/slurm/node_agent.h"

namespace granary::cli {
namespace {

using slurm::CheckJobDirectives;
using slurm::DirectiveError;
using slurm::DirectiveParse;
using slurm::IsSlurmReplacedScript;
using slurm::JobDatasetName;
using slurm::JobDirectives;
using slurm::JobUser;
using slurm::kJobDatasetPrefix;
using slurm::NeedsStore;
using slurm::ParseJobDirectives;
using slurm::ParseUserOrGroupId;
using slurm::PersistentDwDataset;
using slurm::PersistentDwDirective;
using slurm::ReplaceJobIdSymbols;
using slurm::ResolveJobUser;
using slurm::ScriptSymbols;
using slurm::SlurmEpilog;
using slurm::SlurmNodeOptions;
using slurm::SlurmProlog;
using slurm::StageInDirective;

// The node agent's view of the command's context.
class CliNodeAgentContext final : public slurm::NodeAgentContext {
 public:
  explicit CliNodeAgentContext(CliContext& c) : c_(c) {}
  std::ostream& out() override { return c_.out(); }
  Status OpenStore() override { return c_.OpenStore(); }
  MetadataStore& store() override { return c_.store(); }
  std::string StoreUrl() const override { return c_.StoreUrl(); }
  std::string ClusterKeyPath() const override { return c_.ClusterKeyPath(); }
  Status CheckClusterKey() const override { return c_.PeerCredentials().status(); }
  std::string TlsCaPath() const override { return c_.TlsCaPath(); }

 private:
  CliContext& c_;
};

Json DirectivesJson(const JobDirectives& d) {
  Json j = Json::object();
  if (d.jobdw) {
    j["jobdw"] = {{"line", d.jobdw->line},
                  {"capacity_bytes", d.jobdw->capacity_bytes},
                  {"pool", d.jobdw->pool}};
  } else {
    j["jobdw"] = nullptr;
  }
  j["stage_in"] = Json::array();
  // A value holding %j (no job id at submit) is shown as written.
  for (const StageInDirective& s : d.stage_ins) {
    j["stage_in"].push_back(
        {{"line", s.line},
         {"source", s.symbolic && !s.source_written.empty() ? s.source_written : s.source},
         {"name", s.symbolic && !s.name_written.empty() ? s.name_written : s.name}});
  }
  j["persistentdw"] = Json::array();
  for (const PersistentDwDirective& p : d.persistent) {
    j["persistentdw"].push_back({{"line", p.line}, {"name", p.symbolic ? p.name_written : p.name}});
  }
  return j;
}

// The job's user from the uid and gid Slurm passed, with the groups the user
// database lists for it.
Result<JobUser> JobUserOf(const std::string& uid_text, const std::string& gid_text) {
  GRANARY_ASSIGN_OR_RETURN(uint32_t uid, ParseUserOrGroupId(uid_text, "uid"));
  GRANARY_ASSIGN_OR_RETURN(uint32_t gid, ParseUserOrGroupId(gid_text, "gid"));
  return ResolveJobUser(uid, gid);
}

// What `validate` takes: the script, and the submitting user where Slurm
// passes it (23.02 and later; 22.05 passes the script only, and setup checks
// the user's rights instead).
struct ValidateOptions {
  std::string script;
  std::string uid;
  std::string gid;
};

Status Validate(CliContext& c, const ValidateOptions& o) {
  const std::string& script_path = o.script;
  if (o.uid.empty() != o.gid.empty()) {
    return Status::InvalidArgument(
        "granary slurm validate: give --uid and --gid together (the submitting user's)");
  }
  std::optional<JobUser> user;
  if (!o.uid.empty()) {
    GRANARY_ASSIGN_OR_RETURN(user, JobUserOf(o.uid, o.gid));
  }
  Result<std::string> script = ReadFileToString(script_path);
  if (!script.ok()) {
    return Status(script.status().code(), "reading the job script " + Quoted(script_path) + ": " +
                                              script.status().message() +
                                              "; pass the path of a readable file");
  }
  DirectiveParse parse = ParseJobDirectives(*script);
  MetadataStore* store = nullptr;
  if (NeedsStore(parse.directives)) {
    GRANARY_RETURN_IF_ERROR(c.OpenExistingStore());
    store = &c.store();
  }
  GRANARY_RETURN_IF_ERROR(CheckJobDirectives(parse, store, user ? &*user : nullptr));
  if (!parse.errors.empty()) {
    std::string message = "job script " + Quoted(script_path) + ": #DW directives not valid:";
    for (const DirectiveError& e : parse.errors) message += "\n  " + e.ToString();
    return Status::InvalidArgument(std::move(message));
  }
  const JobDirectives& d = parse.directives;
  if (c.json_output()) {
    c.out() << DirectivesJson(d).dump(2) << "\n";
    return Status::Ok();
  }
  if (d.empty()) {
    c.out() << "no #DW directives\n";
    return Status::Ok();
  }
  if (d.jobdw) {
    c.out() << "line " << d.jobdw->line << ": jobdw " << HumanBytes(d.jobdw->capacity_bytes)
            << " in pool " << d.jobdw->pool << "\n";
  }
  for (const StageInDirective& s : d.stage_ins) {
    c.out() << "line " << s.line << ": stage_in "
            << (s.source_written.empty() ? s.source : s.source_written) << " -> $DW_JOB_STRIPED/"
            << (s.name_written.empty() ? s.name : s.name_written) << "\n";
  }
  for (const PersistentDwDirective& p : d.persistent) {
    c.out() << "line " << p.line << ": persistentdw "
            << (p.name_written.empty() ? p.name : p.name_written) << "\n";
  }
  return Status::Ok();
}

// Reads and checks the script again: the later steps act on what validate
// accepted, and a script changed since then is an error, not a guess. %j is
// this job's id; Slurm's symbol-replaced copy (setup and data_in, when a #DW
// line holds a '%') is read with its '%' as literal characters.
Result<JobDirectives> ReadDirectives(const std::string& job_id, const std::string& script_path) {
  Result<std::string> script = ReadFileToString(script_path);
  if (!script.ok()) {
    return Status(script.status().code(), "job " + job_id + ": reading the job script " +
                                              Quoted(script_path) + ": " +
                                              script.status().message());
  }
  DirectiveParse parse = ParseJobDirectives(
      *script, ScriptSymbols{.job_id = job_id, .replaced = IsSlurmReplacedScript(script_path)});
  if (!parse.errors.empty()) {
    return Status::InvalidArgument(
        "job " + job_id + ": #DW directives not valid: " + parse.errors.front().ToString());
  }
  return std::move(parse.directives);
}

Status CheckJobId(const std::string& job_id) {
  // JobDatasetName checks the id; any valid name does.
  return JobDatasetName(job_id, "x").status();
}

// Runs `granary <args>` in-process against the same store; its error output
// becomes the Status message (exit code mapped back to the code).
Status RunNested(CliContext& c, const std::string& what, std::vector<std::string> args) {
  args.insert(args.begin(), {"--store", c.StoreUrl()});
  if (const std::string key = c.ClusterKeyPath(); !key.empty()) {
    args.insert(args.begin(), {"--cluster-key-file", key});
  }
  if (const std::string ca = c.TlsCaPath(); !ca.empty()) {
    args.insert(args.begin(), {"--tls-ca-file", ca});
  }
  std::ostringstream out;
  std::ostringstream err;
  int code = RunCli(args, out, err, /*interactive=*/false);
  if (code == kCliOk) return Status::Ok();
  std::string message = what + ": " + err.str();
  while (!message.empty() && message.back() == '\n') message.pop_back();
  return StatusOfExitCode(code, std::move(message));
}

// {"pools": [{"id", "quantity", "granularity"}]}: each pool with a live cache
// node and its nodes' capacity in bytes (granularity 1 byte).
Status Pools(CliContext& c) {
  GRANARY_RETURN_IF_ERROR(c.OpenExistingStore());
  GRANARY_ASSIGN_OR_RETURN(std::vector<NodeRecord> nodes, c.store().ListNodes(""));
  std::map<std::string, uint64_t> capacity;
  for (const NodeRecord& n : nodes) capacity[n.pool] += n.capacity_bytes;
  Json pools = Json::array();
  for (const auto& [pool, bytes] : capacity) {
    pools.push_back({{"id", pool}, {"quantity", bytes}, {"granularity", 1}});
  }
  c.out() << Json{{"pools", pools}}.dump() << "\n";
  return Status::Ok();
}

struct SlurmJobOptions {
  std::string job_id;
  std::string uid;
  std::string gid;
  std::string script;
  std::string path_file;
  std::string job_root = "/run/granary/slurm";
  std::string timeout = "1h";
};

Status Setup(CliContext& c, const SlurmJobOptions& o) {
  GRANARY_RETURN_IF_ERROR(CheckJobId(o.job_id));
  GRANARY_ASSIGN_OR_RETURN(JobDirectives d, ReadDirectives(o.job_id, o.script));
  GRANARY_RETURN_IF_ERROR(c.OpenStore());
  // The job's user must be allowed to read each persistentdw dataset: its
  // sidecar reads them as root. (Slurm 22.05 gives validate no user, so this
  // is the first place that knows who submitted; the job is held, not run.)
  if (!d.persistent.empty()) {
    GRANARY_ASSIGN_OR_RETURN(JobUser user, JobUserOf(o.uid, o.gid));
    for (const PersistentDwDirective& p : d.persistent) {
      Result<DatasetRecord> record = PersistentDwDataset(c.store(), p, user, o.job_id);
      // Not there yet (a name with %j, made by another job): data_in waits for
      // it, and the prolog checks it where it is served.
      if (!record.ok() && record.status().code() != StatusCode::kNotFound) return record.status();
    }
  }
  for (const StageInDirective& s : d.stage_ins) {
    GRANARY_ASSIGN_OR_RETURN(std::string name, JobDatasetName(o.job_id, s.name));
    // Slurm may run setup again (a retry after slurmctld restarts): a
    // dataset of this job from the same source is this step done already.
    Result<DatasetRecord> existing = c.store().GetDataset(name);
    if (existing.ok() && existing->spec.source_uri == "file://" + s.source) continue;
    GRANARY_RETURN_IF_ERROR(RunNested(
        c, "job " + o.job_id + ": creating dataset " + name + " for line " + std::to_string(s.line),
        {"dataset", "create", name, "--source", s.source, "--pool", d.jobdw->pool, "--owner",
         o.uid + ":" + o.gid, "--no-snapshot", "--no-nodes"}));
  }
  return Status::Ok();
}

Status DataIn(CliContext& c, const SlurmJobOptions& o) {
  GRANARY_RETURN_IF_ERROR(CheckJobId(o.job_id));
  GRANARY_ASSIGN_OR_RETURN(JobDirectives d, ReadDirectives(o.job_id, o.script));
  for (const StageInDirective& s : d.stage_ins) {
    GRANARY_ASSIGN_OR_RETURN(std::string name, JobDatasetName(o.job_id, s.name));
    // Snapshots as the owner when there is no manifest yet; the cache nodes
    // then stage while the job runs.
    GRANARY_RETURN_IF_ERROR(
        RunNested(c, "job " + o.job_id + ": snapshot of " + s.source, {"dataset", "stage", name}));
    GRANARY_RETURN_IF_ERROR(
        RunNested(c, "job " + o.job_id + ": waiting for dataset " + name,
                  {"dataset", "wait", name, "--for", "staging", "--timeout", o.timeout}));
  }
  for (const PersistentDwDirective& p : d.persistent) {
    GRANARY_RETURN_IF_ERROR(
        RunNested(c, "job " + o.job_id + ": waiting for dataset " + p.name,
                  {"dataset", "wait", p.name, "--for", "staging", "--timeout", o.timeout}));
  }
  return Status::Ok();
}

Status Paths(CliContext& c, const SlurmJobOptions& o) {
  GRANARY_RETURN_IF_ERROR(CheckJobId(o.job_id));
  GRANARY_ASSIGN_OR_RETURN(JobDirectives d, ReadDirectives(o.job_id, o.script));
  if (!o.job_root.starts_with('/')) {
    return Status::InvalidArgument("--job-root " + Quoted(o.job_root) + " is not an absolute path");
  }
  std::string dataset;
  if (!d.stage_ins.empty()) {
    GRANARY_ASSIGN_OR_RETURN(dataset, JobDatasetName(o.job_id, d.stage_ins.front().name));
  } else if (!d.persistent.empty()) {
    dataset = d.persistent.front().name;
  }
  std::string lines;
  if (d.jobdw) lines += "DW_JOB_STRIPED=" + o.job_root + "/job-" + o.job_id + "\n";
  lines += "GRANARY_SOCKET=" + o.job_root + "/job-" + o.job_id + ".sock\n";
  if (!dataset.empty()) lines += "GRANARY_DATASET=" + dataset + "\n";
  lines += "GRANARY_STORE=" + c.StoreUrl() + "\n";
  // Slurm hands over an empty file and reads it back: append, as it expects.
  Result<ScopedFd> fd = OpenFile(o.path_file, O_WRONLY | O_APPEND);
  if (!fd.ok()) {
    return Status(fd.status().code(), "job " + o.job_id + ": opening Slurm's path file " +
                                          Quoted(o.path_file) + ": " + fd.status().message());
  }
  Result<uint64_t> end = FileSize(fd->get(), o.path_file);
  if (!end.ok()) return end.status();
  return PwriteFull(fd->get(), lines.data(), lines.size(), *end, o.path_file);
}

Status Teardown(CliContext& c, const SlurmJobOptions& o) {
  GRANARY_RETURN_IF_ERROR(CheckJobId(o.job_id));
  GRANARY_RETURN_IF_ERROR(c.OpenStore());
  // By name, not from the script: Slurm may tear down a job whose script is
  // gone, and again after a teardown that half failed.
  const std::string prefix = std::string(kJobDatasetPrefix) + o.job_id + "-";
  GRANARY_ASSIGN_OR_RETURN(std::vector<DatasetRecord> datasets, c.store().ListDatasets());
  int deleted = 0;
  for (const DatasetRecord& d : datasets) {
    if (!d.name.starts_with(prefix)) continue;
    Status s = c.store().DeleteDataset(d.name);
    if (!s.ok() && s.code() != StatusCode::kNotFound) {
      return Status(s.code(), "job " + o.job_id + ": deleting dataset " + d.name + ": " +
                                  s.message() + " (Slurm retries the teardown)");
    }
    ++deleted;
  }
  c.out() << "job " << o.job_id << ": " << deleted << " job-scoped datasets deleted\n";
  return Status::Ok();
}

// The prolog reads the script as submitted (scontrol write batch_script):
// %j in its #DW lines is put in here, in a private copy, so that it names
// the datasets setup made from Slurm's replaced copy.
Status PrologWithJobId(slurm::NodeAgentContext& c, SlurmNodeOptions o) {
  if (o.script.empty() || CheckJobId(o.job_id).ok() == false) return SlurmProlog(c, o);
  Result<std::string> script = ReadFileToString(o.script);
  if (!script.ok()) return SlurmProlog(c, o);  // it says why
  std::string replaced = ReplaceJobIdSymbols(*script, o.job_id);
  if (replaced == *script) return SlurmProlog(c, o);
  char path[] = "/tmp/granary-prolog-script-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) {
    return Status::Internal("job " + o.job_id + ": a copy of the job script: " + ErrnoText(errno));
  }
  ScopedFd owned(fd);
  Status written = PwriteFull(fd, replaced.data(), replaced.size(), 0, path);
  if (!written.ok()) {
    unlink(path);
    return written;
  }
  o.script = path;
  Status s = SlurmProlog(c, o);
  unlink(path);
  return s;
}

}  // namespace

void AddSlurmCommand(CLI::App& app, CliContext& context) {
  ValidateOptions* v = context.Keep(std::make_unique<ValidateOptions>());
  CLI::App* slurm =
      app.add_subcommand("slurm", "Steps of Slurm's burst_buffer/lua plugin (docs/slurm.md)");
  slurm->require_subcommand(1);
  CLI::App* validate = slurm->add_subcommand(
      "validate", "Check a job script's #DW directives (slurm_bb_job_process)");
  validate->add_option("script", v->script, "The job script")->required();
  validate->add_option("--uid", v->uid,
                       "The submitting user's uid: checks its right to read persistentdw "
                       "datasets (Slurm 23.02+ passes it)");
  validate->add_option("--gid", v->gid, "The submitting user's gid (with --uid)");
  context.OnParsed(validate, [&context, v] { return Validate(context, *v); });

  CLI::App* pools = slurm->add_subcommand("pools", "Capacity of each pool (slurm_bb_pools)");
  context.OnParsed(pools, [&context] { return Pools(context); });

  SlurmJobOptions* o = context.Keep(std::make_unique<SlurmJobOptions>());
  CLI::App* setup = slurm->add_subcommand("setup", "Create the job's datasets (slurm_bb_setup)");
  setup->add_option("job_id", o->job_id, "Slurm job id")->required();
  setup->add_option("uid", o->uid, "The job's user id")->required();
  setup->add_option("gid", o->gid, "The job's group id")->required();
  setup->add_option("script", o->script, "The job script")->required();
  context.OnParsed(setup, [&context, o] { return Setup(context, *o); });

  CLI::App* data_in = slurm->add_subcommand(
      "data_in", "Snapshot the job's datasets, wait until usable (slurm_bb_data_in)");
  data_in->add_option("job_id", o->job_id, "Slurm job id")->required();
  data_in->add_option("script", o->script, "The job script")->required();
  data_in->add_option("--timeout", o->timeout, "Give up after this long per dataset (1h)");
  context.OnParsed(data_in, [&context, o] { return DataIn(context, *o); });

  CLI::App* paths = slurm->add_subcommand("paths", "Write the job's environment (slurm_bb_paths)");
  paths->add_option("job_id", o->job_id, "Slurm job id")->required();
  paths->add_option("script", o->script, "The job script")->required();
  paths->add_option("path_file", o->path_file, "The file Slurm reads NAME=value lines from")
      ->required();
  paths->add_option("--job-root", o->job_root,
                    "Where jobs' directories and sockets are on the nodes (/run/granary/slurm)");
  context.OnParsed(paths, [&context, o] { return Paths(context, *o); });

  CLI::App* teardown = slurm->add_subcommand(
      "teardown", "Delete the job's datasets; idempotent (slurm_bb_job_teardown)");
  teardown->add_option("job_id", o->job_id, "Slurm job id")->required();
  context.OnParsed(teardown, [&context, o] { return Teardown(context, *o); });

  SlurmNodeOptions* n = context.Keep(std::make_unique<SlurmNodeOptions>());
  auto node_options = [n](CLI::App* step) {
    step->add_option("job_id", n->job_id, "Slurm job id ($SLURM_JOB_ID)")->required();
    step->add_option("--job-root", n->job_root,
                     "Where jobs' directories and sockets are (/run/granary/slurm; as in "
                     "burst_buffer.lua)");
    step->add_option("--timeout", n->timeout,
                     "Longest wait for the sidecar to be ready, or to stop (60s)");
  };
  CLI::App* prolog = slurm->add_subcommand(
      "prolog", "On a node before the job: its sidecar and mounted datasets (Prolog)");
  node_options(prolog);
  prolog->add_option("--uid", n->uid, "The job's user id ($SLURM_JOB_UID)")->required();
  prolog->add_option("--gid", n->gid, "The job's group id ($SLURM_JOB_GID)")->required();
  prolog->add_option("--script", n->script,
                     "The job script (scontrol write batch_script); none: not a batch job");
  prolog->add_option("--sidecar", n->sidecar_binary,
                     "The granary-sidecar binary (/usr/bin/granary-sidecar)");
  prolog->add_option("--log-dir", n->log_dir, "Where the sidecar's log goes (/var/log/granary)");
  prolog->add_option("--node", n->node,
                     "This host's cache node id, which stages the job's datasets (default "
                     "$SLURMD_NODENAME, else the host name)");
  context.OnParsed(prolog, [&context, n] {
    CliNodeAgentContext agent(context);
    return PrologWithJobId(agent, *n);
  });
  CLI::App* epilog = slurm->add_subcommand(
      "epilog", "On a node after the job: sidecar stopped, views unmounted, files removed");
  node_options(epilog);
  context.OnParsed(epilog, [&context, n] {
    CliNodeAgentContext agent(context);
    return SlurmEpilog(agent, *n);
  });
}

}  // namespace granary::cli

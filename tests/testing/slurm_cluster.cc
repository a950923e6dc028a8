#include "testing/slurm_cluster.h"

#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <sstream>

#include "granary/core/file.h"

namespace granary::testing {
namespace {

using std::chrono::milliseconds;

constexpr const char* kMunged = "/usr/sbin/munged";
constexpr const char* kSlurmctld = "/usr/sbin/slurmctld";
constexpr const char* kSlurmd = "/usr/sbin/slurmd";
constexpr const char* kSetpriv = "/usr/bin/setpriv";
constexpr const char* kClients[] = {"/usr/bin/sbatch", "/usr/bin/scontrol", "/usr/bin/sinfo",
                                    "/usr/bin/squeue", "/usr/bin/scancel"};
constexpr const char* kLuaPlugin = "/usr/lib/x86_64-linux-gnu/slurm-wlm/burst_buffer_lua.so";

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// Replaces the line starting with `key` (the settings block at the top of a
// plugin script) by `line`; kNotFound if the script has no such line.
Status SetSetting(std::string* script, const std::string& key, const std::string& line,
                  const std::string& what) {
  size_t at = script->starts_with(key) ? 0 : script->find("\n" + key);
  if (at == std::string::npos) {
    return Status::NotFound("setting " + key + " not found in " + what);
  }
  if (at != 0) ++at;
  const size_t end = script->find('\n', at);
  script->replace(at, end == std::string::npos ? std::string::npos : end - at, line);
  return Status::Ok();
}

Status CopyWithSettings(const std::string& from, const std::string& to,
                        const std::vector<std::pair<std::string, std::string>>& settings,
                        mode_t mode) {
  GRANARY_ASSIGN_OR_RETURN(std::string text, ReadFileToString(from));
  for (const auto& setting : settings) {
    GRANARY_RETURN_IF_ERROR(SetSetting(&text, setting.first, setting.second, from));
  }
  GRANARY_RETURN_IF_ERROR(WriteFileAtomically(to, text, mode));
  if (::chmod(to.c_str(), mode) != 0) return Status::FromErrno(errno, "chmod " + to);
  return Status::Ok();
}

std::string LuaString(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

std::string ShellWord(const std::string& s) {
  std::string out = "'";
  for (char ch : s) {
    if (ch == '\'') {
      out += "'\\''";
    } else {
      out += ch;
    }
  }
  return out + "'";
}

std::string Tail(const std::string& text, size_t max_bytes) {
  return text.size() <= max_bytes ? text : text.substr(text.size() - max_bytes);
}

}  // namespace

bool SlurmCluster::Available(std::string* why) {
  std::vector<std::string> needed = {kMunged, kSlurmctld, kSlurmd, kSetpriv, kLuaPlugin};
  for (const char* c : kClients) needed.emplace_back(c);
  for (const std::string& path : needed) {
    if (!Exists(path)) {
      *why = path +
             " is not installed (scripts/install-deps installs slurmctld, slurmd, slurm-client, "
             "slurm-wlm-basic-plugins and munge)";
      return false;
    }
  }
  if (::geteuid() != 0) {
    *why =
        "the Slurm daemons of the test cluster must run as root (slurmd runs jobs as their user)";
    return false;
  }
  return true;
}

SlurmCluster::SlurmCluster(SlurmClusterOptions options) : options_(std::move(options)) {
  struct utsname u {};
  node_name_ = ::uname(&u) == 0 ? u.nodename : "localhost";
}

Result<std::unique_ptr<SlurmCluster>> SlurmCluster::Start(SlurmClusterOptions options) {
  std::unique_ptr<SlurmCluster> cluster(new SlurmCluster(std::move(options)));
  GRANARY_RETURN_IF_ERROR(cluster->WriteFiles());
  GRANARY_RETURN_IF_ERROR(cluster->StartDaemons());
  return cluster;
}

Status SlurmCluster::WriteFiles() {
  const std::string d = dir_.path();
  // The submitting user must reach the job's files and the jobs' directory.
  if (::chmod(d.c_str(), 0755) != 0) return Status::FromErrno(errno, "chmod " + d);
  for (const char* sub : {"munge", "state", "spool", "log", "jobs", "out"}) {
    const std::string path = dir_.Join(sub);
    if (::mkdir(path.c_str(), 0755) != 0) return Status::FromErrno(errno, "mkdir " + path);
  }
  const std::string out = out_dir();
  if (::chmod(out.c_str(), 0777) != 0) return Status::FromErrno(errno, "chmod " + out);

  // A fresh munge key, readable by root only (munged refuses anything else).
  GRANARY_RETURN_IF_ERROR(
      WriteFileAtomically(dir_.Join("munge/munge.key"), Bytes("munge-key-" + d, 1024), 0400));

  const uint16_t ctld_port = FreeTcpPort();
  const uint16_t slurmd_port = FreeTcpPort();
  std::ostringstream conf;
  conf << "ClusterName=granarytest\n"
       << "SlurmctldHost=" << node_name_ << "(127.0.0.1)\n"
       << "SlurmctldPort=" << ctld_port << "\n"
       << "SlurmdPort=" << slurmd_port << "\n"
       << "SlurmUser=root\nSlurmdUser=root\n"
       << "AuthType=auth/munge\nCredType=cred/munge\n"
       << "AuthInfo=socket=" << dir_.Join("munge/munge.sock") << "\n"
       << "StateSaveLocation=" << dir_.Join("state") << "\n"
       << "SlurmdSpoolDir=" << dir_.Join("spool") << "\n"
       << "SlurmctldPidFile=" << dir_.Join("slurmctld.pid") << "\n"
       << "SlurmdPidFile=" << dir_.Join("slurmd.pid") << "\n"
       << "SlurmctldLogFile=" << dir_.Join("log/slurmctld.log") << "\n"
       << "SlurmdLogFile=" << dir_.Join("log/slurmd.log") << "\n"
       << "SlurmctldDebug=debug\nSlurmdDebug=debug\nDebugFlags=BurstBuffer\n"
       << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
       << "SchedulerType=sched/backfill\nSelectType=select/cons_tres\n"
       // A job whose stage-in ended starts at the next scheduling pass: fast here.
       << "SchedulerParameters=bf_interval=1,sched_interval=1\n"
       << "SelectTypeParameters=CR_Core\nReturnToService=2\nMpiDefault=none\n"
       << "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
       << "MinJobAge=300\n"
       << "BurstBufferType=burst_buffer/lua\n"
       << "PrologFlags=Alloc\n"
       << "Prolog=" << dir_.Join("prolog.sh") << "\n"
       << "Epilog=" << dir_.Join("epilog.sh") << "\n"
       << "NodeName=" << node_name_ << " NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN\n"
       << "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n";
  GRANARY_RETURN_IF_ERROR(WriteFileAtomically(conf_path(), conf.str(), 0644));
  GRANARY_RETURN_IF_ERROR(WriteFileAtomically(
      dir_.Join("burst_buffer.conf"),
      "Directive=DW\nStageInTimeout=" + options_.stage_in_timeout + "\nOtherTimeout=60\n", 0644));

  const std::string& p = options_.plugin_dir;
  GRANARY_RETURN_IF_ERROR(CopyWithSettings(
      p + "/burst_buffer.lua", dir_.Join("burst_buffer.lua"),
      {{"local GRANARY =", "local GRANARY = " + LuaString(options_.granary_binary)},
       {"local STORE =", "local STORE = " + LuaString(options_.store_url)},
       {"local JOB_ROOT =", "local JOB_ROOT = " + LuaString(job_root())},
       {"local DATA_IN_TIMEOUT =", "local DATA_IN_TIMEOUT = \"100s\""}},
      0644));
  const std::vector<std::pair<std::string, std::string>> node_settings = {
      {"GRANARY=", "GRANARY=" + ShellWord(options_.granary_binary)},
      {"SIDECAR=", "SIDECAR=" + ShellWord(options_.sidecar_binary)},
      {"STORE=", "STORE=" + ShellWord(options_.store_url)},
      {"JOB_ROOT=", "JOB_ROOT=" + ShellWord(job_root())},
      {"LOG_DIR=", "LOG_DIR=" + ShellWord(dir_.Join("log"))},
  };
  std::vector<std::pair<std::string, std::string>> prolog_settings = node_settings;
  prolog_settings.emplace_back(
      "NODE=", "NODE=" + (options_.cache_node_id.empty() ? std::string()
                                                         : ShellWord(options_.cache_node_id)));
  prolog_settings.emplace_back(
      "CLUSTER_KEY=",
      "CLUSTER_KEY=" + (options_.cluster_key_file.empty() ? std::string()
                                                          : ShellWord(options_.cluster_key_file)));
  GRANARY_RETURN_IF_ERROR(
      CopyWithSettings(p + "/prolog.sh", dir_.Join("prolog.sh"), prolog_settings, 0755));
  GRANARY_RETURN_IF_ERROR(
      CopyWithSettings(p + "/epilog.sh", dir_.Join("epilog.sh"), node_settings, 0755));
  return Status::Ok();
}

Status SlurmCluster::StartDaemons() {
  const std::string sock = dir_.Join("munge/munge.sock");
  DaemonProcessOptions munge;
  munge.binary = kMunged;
  munge.args = {"--foreground",
                "--force",
                "--socket=" + sock,
                "--key-file=" + dir_.Join("munge/munge.key"),
                "--pid-file=" + dir_.Join("munge/munged.pid"),
                "--seed-file=" + dir_.Join("munge/munged.seed"),
                "--log-file=" + dir_.Join("log/munged.log")};
  munge.log_path = dir_.Join("log/munged.out");
  munge.name = "munged";
  GRANARY_ASSIGN_OR_RETURN(munged_, DaemonProcess::Start(munge));
  if (!WaitFor([&] { return Exists(sock) || !munged_->Running(); }, milliseconds(10000)) ||
      !munged_->Running()) {
    return Status::Unavailable("munged did not create its socket " + sock + ": " +
                               munged_->LogTail(2048));
  }

  const std::vector<std::string> env = {"SLURM_CONF=" + conf_path()};
  DaemonProcessOptions ctld;
  ctld.binary = kSlurmctld;
  ctld.args = {"-D", "-i", "-f", conf_path()};
  ctld.log_path = dir_.Join("log/slurmctld.out");
  ctld.env = env;
  ctld.name = "slurmctld";
  GRANARY_ASSIGN_OR_RETURN(slurmctld_, DaemonProcess::Start(ctld));

  DaemonProcessOptions slurmd;
  slurmd.binary = kSlurmd;
  slurmd.args = {"-D", "-N", node_name_, "-f", conf_path()};
  slurmd.log_path = dir_.Join("log/slurmd.out");
  slurmd.env = env;
  slurmd.name = "slurmd";
  GRANARY_ASSIGN_OR_RETURN(slurmd_, DaemonProcess::Start(slurmd));

  std::string last;
  const bool idle = WaitFor(
      [&] {
        if (!slurmctld_->Running() || !slurmd_->Running()) return true;
        Result<std::string> state = NodeState();
        last = state.ok() ? *state : state.status().ToString();
        return state.ok() && *state == "idle";
      },
      options_.start_timeout, milliseconds(200));
  if (!slurmctld_->Running() || !slurmd_->Running() || !idle) {
    return Status::Unavailable("the test's Slurm node did not become idle (last: " + last + "):\n" +
                               LogTails(4096));
  }
  return Status::Ok();
}

SlurmCluster::~SlurmCluster() {
  if (slurmctld_ != nullptr && slurmctld_->Running()) {
    (void)Run({"scancel", "--full", "--partition=debug"}, /*as_user=*/false,
              std::chrono::seconds(10));
    WaitFor(
        [&] {
          Result<SlurmCommandResult> q = Run({"squeue", "-h"}, false, std::chrono::seconds(10));
          return !q.ok() || q->output.empty();
        },
        std::chrono::seconds(30), milliseconds(200));
  }
  for (std::unique_ptr<DaemonProcess>* d : {&slurmd_, &slurmctld_, &munged_}) {
    if (*d != nullptr) (void)(*d)->Terminate(std::chrono::seconds(20));
  }
}

Result<SlurmCommandResult> SlurmCluster::Run(const std::vector<std::string>& argv, bool as_user,
                                             std::chrono::milliseconds timeout) {
  DaemonProcessOptions o;
  if (as_user) {
    o.binary = kSetpriv;
    o.args = {"--reuid=" + std::to_string(options_.user_uid),
              "--regid=" + std::to_string(options_.user_gid), "--clear-groups", "--"};
    o.args.insert(o.args.end(), argv.begin(), argv.end());
  } else {
    o.binary = argv.at(0);
    o.args.assign(argv.begin() + 1, argv.end());
  }
  o.log_path = dir_.Join("log/command-" + std::to_string(++commands_run_) + ".out");
  o.env = {"SLURM_CONF=" + conf_path(), "PATH=/usr/sbin:/usr/bin:/sbin:/bin"};
  o.name = argv.at(0);
  o.fail_on_sanitizer_report = false;
  GRANARY_ASSIGN_OR_RETURN(std::unique_ptr<DaemonProcess> p, DaemonProcess::Start(o));
  Result<ExitStatus> status = p->Wait(timeout);
  if (!status.ok()) {
    (void)p->Kill();
    return Status::DeadlineExceeded(o.name + " did not end within " +
                                    std::to_string(timeout.count()) + " ms: " + p->LogTail(2048));
  }
  SlurmCommandResult result;
  result.exit_code = status->exited ? status->code : 128 + status->signal;
  result.output = p->ReadLog();
  ::unlink(o.log_path.c_str());
  return result;
}

Result<std::string> SlurmCluster::Submit(const std::string& script_path,
                                         const std::vector<std::string>& sbatch_args) {
  std::vector<std::string> argv = {"sbatch", "--parsable"};
  argv.insert(argv.end(), sbatch_args.begin(), sbatch_args.end());
  argv.push_back(script_path);
  GRANARY_ASSIGN_OR_RETURN(SlurmCommandResult r, Run(argv, /*as_user=*/true));
  std::string id = r.output;
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  if (r.exit_code != 0 || id.empty() || id.find_first_not_of("0123456789") != std::string::npos) {
    return Status::InvalidArgument("sbatch " + script_path + " (exit " +
                                   std::to_string(r.exit_code) + "): " + r.output);
  }
  return id;
}

Result<std::map<std::string, std::string>> SlurmCluster::ShowJob(const std::string& job_id) {
  GRANARY_ASSIGN_OR_RETURN(SlurmCommandResult r,
                           Run({"scontrol", "show", "job", "-o", job_id}, /*as_user=*/false));
  if (r.exit_code != 0) {
    if (r.output.find("Invalid job id") != std::string::npos) {
      return Status::NotFound("job " + job_id + " is gone: " + r.output);
    }
    return Status::Unavailable("scontrol show job " + job_id + ": " + r.output);
  }
  // One line of Key=Value words; a value runs to the next " Key=" (values such
  // as SystemComment hold spaces), so split on the keys.
  std::map<std::string, std::string> fields;
  std::string line = r.output.substr(0, r.output.find('\n'));
  size_t at = 0;
  std::string key;
  while (at < line.size()) {
    const size_t eq = line.find('=', at);
    if (eq == std::string::npos) break;
    key = line.substr(at, eq - at);
    size_t next = eq + 1;
    size_t value_end = line.size();
    // The next word that looks like " Key=" with Key a capitalised word.
    for (size_t sp = line.find(' ', next); sp != std::string::npos; sp = line.find(' ', sp + 1)) {
      const size_t next_eq = line.find('=', sp + 1);
      const size_t next_sp = line.find(' ', sp + 1);
      if (next_eq != std::string::npos && (next_sp == std::string::npos || next_eq < next_sp) &&
          sp + 1 < line.size() && std::isupper(static_cast<unsigned char>(line[sp + 1])) != 0) {
        value_end = sp;
        break;
      }
    }
    fields[key] = line.substr(next, value_end - next);
    at = value_end + 1;
  }
  return fields;
}

Result<std::map<std::string, std::string>> SlurmCluster::WaitForJobState(
    const std::string& job_id, const std::set<std::string>& states,
    std::chrono::milliseconds timeout) {
  std::map<std::string, std::string> last;
  Status last_error = Status::Ok();
  const bool reached = WaitFor(
      [&] {
        Result<std::map<std::string, std::string>> f = ShowJob(job_id);
        if (!f.ok()) {
          last_error = f.status();
          return false;
        }
        last = std::move(*f);
        return states.contains(last["JobState"]);
      },
      timeout, milliseconds(250));
  if (reached) return last;
  std::string wanted;
  for (const std::string& s : states) wanted += (wanted.empty() ? "" : "|") + s;
  return Status::DeadlineExceeded(
      "job " + job_id + " did not reach " + wanted + " within " + std::to_string(timeout.count()) +
      " ms: state " + last["JobState"] + ", reason " + last["Reason"] + ", comment " +
      last["SystemComment"] + (last_error.ok() ? "" : ", last error " + last_error.ToString()) +
      "\n" + LogTails(4096));
}

Result<std::string> SlurmCluster::NodeState() {
  GRANARY_ASSIGN_OR_RETURN(SlurmCommandResult r, Run({"sinfo", "-h", "-N", "-o", "%t"},
                                                     /*as_user=*/false, std::chrono::seconds(10)));
  if (r.exit_code != 0) return Status::Unavailable("sinfo: " + r.output);
  std::string state = r.output;
  while (!state.empty() && (state.back() == '\n' || state.back() == ' ')) state.pop_back();
  return state;
}

std::string SlurmCluster::LogTails(size_t max_bytes) const {
  std::string out;
  for (const char* log : {"log/slurmctld.log", "log/slurmd.log"}) {
    Result<std::string> text = ReadFileToString(dir_.Join(log));
    out += std::string("--- ") + log + " ---\n" +
           (text.ok() ? Tail(*text, max_bytes) : text.status().ToString()) + "\n";
    if (!text.ok()) continue;
    // What the plugin, the prolog and the epilog said, from anywhere in it.
    std::string ours;
    std::istringstream lines(*text);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.find("granary") != std::string::npos || line.find("rolog") != std::string::npos ||
          line.find("pilog") != std::string::npos ||
          line.find("burst_buffer") != std::string::npos) {
        ours += line + "\n";
      }
    }
    out += std::string("--- ") + log + ": granary, prolog, epilog, burst_buffer ---\n" +
           Tail(ours, max_bytes) + "\n";
  }
  return out;
}

}  // namespace granary::testing

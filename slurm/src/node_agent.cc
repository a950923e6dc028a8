#include "granary/slurm/node_agent.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "granary/core/config.h"
#include "granary/core/file.h"
#include "granary/core/names.h"
#include "granary/posix/mount_point.h"
#include "granary/slurm/directives.h"
#include "granary/source/identity.h"

extern char** environ;

namespace granary::slurm {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kPollEvery{50};
constexpr milliseconds kKillWait{5000};

// A /proc file's contents (they report size 0, so ReadFileToString, which
// reads st_size bytes, sees nothing); empty if it cannot be read.
std::string ReadProcFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return in ? text.str() : std::string();
}

// Where one job's things are on a node.
struct JobPaths {
  std::string job_dir;    // $DW_JOB_STRIPED
  std::string socket;     // $GRANARY_SOCKET
  std::string state_dir;  // the sidecar's config and pid
  std::string config;
  std::string pid_file;
  std::string log;  // the sidecar's output, kept after the job
};

JobPaths PathsOf(const SlurmNodeOptions& o) {
  JobPaths p;
  p.job_dir = o.job_root + "/job-" + o.job_id;
  p.socket = o.job_root + "/job-" + o.job_id + ".sock";
  p.state_dir = o.job_root + "/.job-" + o.job_id;
  p.config = p.state_dir + "/sidecar.yaml";
  p.pid_file = p.state_dir + "/sidecar.pid";
  p.log = o.log_dir + "/slurm-job-" + o.job_id + "-sidecar.log";
  return p;
}

Status CheckCommon(const SlurmNodeOptions& o) {
  GRANARY_RETURN_IF_ERROR(JobDatasetName(o.job_id, "x").status());
  if (!o.job_root.starts_with('/') || o.job_root.find("/../") != std::string::npos) {
    return Status::InvalidArgument("--job-root " + Quoted(o.job_root) +
                                   " is not an absolute path; write e.g. /run/granary/slurm");
  }
  return Status::Ok();
}

Status MakeDir(const std::string& path, mode_t mode) {
  if (::mkdir(path.c_str(), mode) != 0 && errno != EEXIST) {
    return Status::FromErrno(errno, "creating the directory " + Quoted(path));
  }
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return Status::FromErrno(errno, "stat " + Quoted(path));
  if (!S_ISDIR(st.st_mode)) {
    return Status::FailedPrecondition(Quoted(path) + " exists and is not a directory; remove it");
  }
  if (::chmod(path.c_str(), mode) != 0) return Status::FromErrno(errno, "chmod " + Quoted(path));
  return Status::Ok();
}

// A loopback TCP port that was free when asked, for the sidecar's /readyz.
Result<uint16_t> FreeLoopbackPort() {
  ScopedFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Status::FromErrno(errno, "creating a socket to find a free port");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return Status::FromErrno(errno, "finding a free loopback port for the sidecar's /readyz");
  }
  return ntohs(addr.sin_port);
}

// The HTTP status of GET http://127.0.0.1:<port>/readyz; 0 if nothing answers
// within 2 s.
int ReadyzStatus(uint16_t port) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(2, 0);
  client.set_read_timeout(2, 0);
  client.set_write_timeout(2, 0);
  const httplib::Result response = client.Get("/readyz");
  return response ? response->status : 0;
}

std::string LogTail(const std::string& path, size_t max_bytes = 2048) {
  Result<std::string> text = ReadFileToString(path);
  if (!text.ok()) return "(no log: " + text.status().message() + ")";
  std::string tail = text->size() <= max_bytes ? *text : text->substr(text->size() - max_bytes);
  while (!tail.empty() && tail.back() == '\n') tail.pop_back();
  return tail;
}

// Starts the sidecar in a session of its own (it must outlive the prolog and
// not hold slurmd's descriptors): stdin /dev/null, stdout and stderr the log.
Result<pid_t> SpawnSidecar(const std::string& binary, const JobPaths& p) {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  if (posix_spawn_file_actions_init(&actions) != 0 || posix_spawnattr_init(&attr) != 0) {
    return Status::Internal("initialising posix_spawn");
  }
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, p.log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0640);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  sigset_t defaults;
  sigfillset(&defaults);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, static_cast<short>(POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK |
                                                     POSIX_SPAWN_SETSIGDEF));
  std::vector<std::string> args = {binary, "--config", p.config};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, binary.c_str(), &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    return Status::FromErrno(rc, "starting the sidecar " + Quoted(binary) +
                                     " (set SIDECAR in prolog.sh to the granary-sidecar binary)");
  }
  return pid;
}

// Whether `pid` is still a live process running the sidecar of `config`
// (its command line names the config), so a pid reused by another process is
// never signalled. A zombie counts as gone.
bool IsOurSidecar(pid_t pid, const std::string& config) {
  const std::string proc = "/proc/" + std::to_string(pid);
  const std::string stat = ReadProcFile(proc + "/stat");
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] == 'Z') {
    return false;
  }
  return ReadProcFile(proc + "/cmdline").find(config) != std::string::npos;
}

// Stops the sidecar named by the pid file: SIGTERM (it unmounts its views
// first), SIGKILL after `timeout`. OK if there is none.
Status StopSidecar(const JobPaths& p, milliseconds timeout, std::string* done) {
  Result<std::string> text = ReadFileToString(p.pid_file);
  if (!text.ok()) return Status::Ok();  // never started, or already stopped
  pid_t pid = 0;
  std::from_chars(text->data(), text->data() + text->size(), pid);
  if (pid <= 1 || !IsOurSidecar(pid, p.config)) return Status::Ok();
  ::kill(pid, SIGTERM);
  auto wait_gone = [&](milliseconds limit) {
    const Clock::time_point deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      (void)::waitpid(pid, nullptr, WNOHANG);  // ours when the prolog itself cleans up
      if (!IsOurSidecar(pid, p.config)) return true;
      std::this_thread::sleep_for(kPollEvery);
    }
    return !IsOurSidecar(pid, p.config);
  };
  if (wait_gone(timeout)) {
    *done += "sidecar " + std::to_string(pid) + " stopped; ";
    return Status::Ok();
  }
  ::kill(pid, SIGKILL);
  if (wait_gone(kKillWait)) {
    *done += "sidecar " + std::to_string(pid) + " killed (no exit " +
             std::to_string(timeout.count()) + " ms after SIGTERM); ";
    return Status::Ok();
  }
  return Status::Unavailable("sidecar pid " + std::to_string(pid) +
                             " is still running after SIGKILL; check it with ps");
}

// Mount points at or under `dir` (/proc/self/mountinfo, octal escapes decoded).
std::vector<std::string> MountsUnder(const std::string& dir) {
  std::vector<std::string> out;
  std::istringstream lines(ReadProcFile("/proc/self/mountinfo"));
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::string w;
    std::string point;
    for (int i = 0; i < 5 && (words >> w); ++i) point = w;
    std::string decoded;
    for (size_t i = 0; i < point.size(); ++i) {
      if (point[i] == '\\' && i + 3 < point.size()) {
        int v = 0;
        std::from_chars(point.data() + i + 1, point.data() + i + 4, v, 8);
        decoded += static_cast<char>(v);
        i += 3;
      } else {
        decoded += point[i];
      }
    }
    if (decoded == dir || decoded.starts_with(dir + "/")) out.push_back(decoded);
  }
  // Deepest first.
  std::sort(out.begin(), out.end(),
            [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  return out;
}

// Everything the prolog made for the job, gone; what is gone already is fine.
Status CleanUpJob(const SlurmNodeOptions& o, milliseconds timeout, std::string* done) {
  const JobPaths p = PathsOf(o);
  GRANARY_RETURN_IF_ERROR(StopSidecar(p, timeout, done));
  int unmounted = 0;
  for (const std::string& m : MountsUnder(p.job_dir)) {
    Status s = posix::LazyUnmount(m);
    if (!s.ok()) return s.WithContext("job " + o.job_id + ": unmounting " + Quoted(m));
    ++unmounted;
  }
  if (unmounted > 0) *done += std::to_string(unmounted) + " stale views unmounted; ";
  if (std::vector<std::string> left = MountsUnder(p.job_dir); !left.empty()) {
    return Status::Unavailable("job " + o.job_id + ": " + Quoted(left.front()) +
                               " is still mounted; unmount it with umount -l");
  }
  std::error_code ec;
  for (const std::string& path : {p.job_dir, p.state_dir}) {
    if (std::filesystem::remove_all(path, ec) == static_cast<std::uintmax_t>(-1) || ec) {
      return Status::FromErrno(ec.value(), "job " + o.job_id + ": removing " + Quoted(path));
    }
  }
  if (::unlink(p.socket.c_str()) != 0 && errno != ENOENT) {
    return Status::FromErrno(errno,
                             "job " + o.job_id + ": removing the socket " + Quoted(p.socket));
  }
  return Status::Ok();
}

struct JobDataset {
  std::string dataset;  // the store's name
  std::string mount;    // stage_in: its name under $DW_JOB_STRIPED; else empty
};

// The job's datasets (stage_in ones from the store, checked against the
// script) and its pool; an empty list and no pool: not a Granary job.
Status FindJobDatasets(NodeAgentContext& c, const SlurmNodeOptions& o, uint32_t uid, uint32_t gid,
                       std::vector<JobDataset>* out, std::string* pool) {
  const std::string prefix = std::string(kJobDatasetPrefix) + o.job_id + "-";
  auto list_own = [&]() -> Result<std::vector<DatasetRecord>> {
    GRANARY_RETURN_IF_ERROR(c.OpenStore());
    GRANARY_ASSIGN_OR_RETURN(std::vector<DatasetRecord> all, c.store().ListDatasets());
    std::vector<DatasetRecord> own;
    for (DatasetRecord& d : all) {
      if (d.name.starts_with(prefix)) own.push_back(std::move(d));
    }
    return own;
  };
  if (o.script.empty()) {
    // Not a batch job (or scontrol could not give the script): #DW lives in
    // batch scripts, so this is a Granary job only if setup made datasets
    // for it. A store that cannot be asked must not fail (and drain the
    // node for) every such job: say so and do nothing.
    Result<std::vector<DatasetRecord>> own = list_own();
    if (!own.ok()) {
      c.out() << "job " << o.job_id << ": no script, and the store cannot be asked ("
              << own.status().message() << "); nothing done\n";
      return Status::Ok();
    }
    if (own->empty()) return Status::Ok();
    return Status::FailedPrecondition(
        "job " + o.job_id + " has datasets (" + own->front().name +
        ") but its script was not given; prolog.sh reads it with `scontrol write batch_script`");
  }
  Result<std::string> script = ReadFileToString(o.script);
  if (!script.ok()) {
    return Status(script.status().code(), "job " + o.job_id + ": reading the job script " +
                                              Quoted(o.script) + ": " + script.status().message());
  }
  DirectiveParse parse = ParseJobDirectives(*script);
  if (!parse.errors.empty()) {
    return Status::InvalidArgument(
        "job " + o.job_id + ": #DW directives not valid: " + parse.errors.front().ToString());
  }
  const JobDirectives directives = std::move(parse.directives);
  // Most jobs: no store needed.
  if (directives.empty()) return Status::Ok();
  GRANARY_ASSIGN_OR_RETURN(std::vector<DatasetRecord> own, list_own());
  if (directives.jobdw) *pool = directives.jobdw->pool;
  auto use = [&](const DatasetRecord& d, const std::string& mount) -> Status {
    if (d.state.phase != DatasetPhase::kStaging && d.state.phase != DatasetPhase::kReady) {
      return Status::FailedPrecondition(
          "job " + o.job_id + ": dataset " + Quoted(d.name) + " is " +
          std::string(DatasetPhaseName(d.state.phase)) + ", not Staging or Ready" +
          (d.state.message.empty() ? "" : " (" + d.state.message + ")") +
          "; see granary dataset show " + d.name);
    }
    if (pool->empty()) *pool = d.spec.pool;
    if (d.spec.pool != *pool) {
      return Status::FailedPrecondition("job " + o.job_id + ": dataset " + Quoted(d.name) +
                                        " is in pool " + Quoted(d.spec.pool) + ", not the job's " +
                                        Quoted(*pool) +
                                        "; one job's sidecar serves one pool, use datasets of it");
    }
    out->push_back({d.name, mount});
    return Status::Ok();
  };
  for (const StageInDirective& s : directives.stage_ins) {
    GRANARY_ASSIGN_OR_RETURN(std::string name, JobDatasetName(o.job_id, s.name));
    auto it = std::find_if(own.begin(), own.end(),
                           [&name](const DatasetRecord& d) { return d.name == name; });
    if (it == own.end()) {
      return Status::NotFound("job " + o.job_id + ": dataset " + Quoted(name) + " for line " +
                              std::to_string(s.line) +
                              " is not in the store; `granary slurm setup` makes it before the "
                              "job starts (slurmctld's log says why it did not)");
    }
    GRANARY_RETURN_IF_ERROR(use(*it, s.name));
  }
  JobUser user;
  if (!directives.persistent.empty()) {
    GRANARY_ASSIGN_OR_RETURN(user, ResolveJobUser(uid, gid));
  }
  for (const PersistentDwDirective& d : directives.persistent) {
    // Checked at submission and at setup already; checked again here, where
    // the bytes are served, against the record as it is now (a grant may
    // have been revoked while the job waited).
    GRANARY_ASSIGN_OR_RETURN(DatasetRecord record,
                             PersistentDwDataset(c.store(), d, user, o.job_id));
    GRANARY_RETURN_IF_ERROR(use(record, ""));
  }
  return Status::Ok();
}

// This host's cache node id: --node, else $SLURMD_NODENAME, else the host name.
std::string ThisNode(const SlurmNodeOptions& o) {
  if (!o.node.empty()) return o.node;
  const char* slurm_name = std::getenv("SLURMD_NODENAME");
  if (slurm_name != nullptr && *slurm_name != '\0') return slurm_name;
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "";
  return host;
}

// Adds this host's cache node to the node list of each of the job's stage_in
// datasets (made on no node by setup), so that staging onto the job's nodes
// starts with the job. A dataset on the whole pool (no list) is left so.
// Notes in `*note` when no live cache node of the pool has that id: the job
// then reads from the source.
Status PlaceOnThisNode(NodeAgentContext& c, const SlurmNodeOptions& o,
                       const std::vector<JobDataset>& datasets, const std::string& pool,
                       std::string* note) {
  const std::string node = ThisNode(o);
  GRANARY_RETURN_IF_ERROR(ValidateNodeId(node).WithContext(
      "job " + o.job_id +
      ": this host's cache node id (--node, $SLURMD_NODENAME or the host name)"));
  bool placed = false;
  for (const JobDataset& d : datasets) {
    if (d.mount.empty()) continue;  // persistentdw: placed by its owner
    bool done = false;
    for (int attempt = 0; attempt < 20 && !done; ++attempt) {
      GRANARY_ASSIGN_OR_RETURN(DatasetRecord record, c.store().GetDataset(d.dataset));
      std::optional<std::vector<std::string>>& nodes = record.spec.nodes;
      if (!nodes.has_value() || std::find(nodes->begin(), nodes->end(), node) != nodes->end()) {
        done = true;
        break;
      }
      nodes->push_back(node);
      std::sort(nodes->begin(), nodes->end());
      Result<DatasetRecord> updated = c.store().UpdateDataset(record);
      if (updated.ok()) {
        done = placed = true;
      } else if (updated.status().code() != StatusCode::kFailedPrecondition) {
        return updated.status().WithContext("job " + o.job_id + ": placing dataset " +
                                            Quoted(d.dataset) + " on node " + Quoted(node));
      }
    }
    if (!done) {
      return Status::FailedPrecondition(
          "job " + o.job_id + ": dataset " + Quoted(d.dataset) +
          " kept changing while this node was added to it; the prolog can "
          "be run again");
    }
  }
  if (!placed) return Status::Ok();
  GRANARY_ASSIGN_OR_RETURN(std::vector<NodeRecord> live, c.store().ListNodes(pool));
  if (std::none_of(live.begin(), live.end(),
                   [&node](const NodeRecord& n) { return n.id == node; })) {
    *note = "; no live cache node " + Quoted(node) + " in pool " + Quoted(pool) +
            ": the job reads its data from the source (run granary-cachenode here, or set NODE "
            "in prolog.sh to its node_id)";
  } else {
    *note = "; staging onto cache node " + node;
  }
  return Status::Ok();
}

Status StartJobSidecar(NodeAgentContext& c, const SlurmNodeOptions& o, const std::string& pool,
                       const std::vector<JobDataset>& datasets, uint32_t uid, uint32_t gid,
                       milliseconds timeout, std::string* started) {
  const JobPaths p = PathsOf(o);
  GRANARY_RETURN_IF_ERROR(MakeDir(o.job_root, 0755));
  GRANARY_RETURN_IF_ERROR(MakeDir(o.log_dir, 0755));
  GRANARY_RETURN_IF_ERROR(MakeDir(p.state_dir, 0700));
  GRANARY_RETURN_IF_ERROR(MakeDir(p.job_dir, 0755));
  std::string mounts;
  for (const JobDataset& d : datasets) {
    if (d.mount.empty()) continue;
    const std::string dir = p.job_dir + "/" + d.mount;
    GRANARY_RETURN_IF_ERROR(MakeDir(dir, 0755));
    mounts += (mounts.empty() ? "" : ",") + d.dataset + ":" + dir;
  }
  GRANARY_ASSIGN_OR_RETURN(uint16_t port, FreeLoopbackPort());
  std::ostringstream yaml;
  yaml << "# granary slurm prolog: the sidecar of Slurm job " << o.job_id << "\n"
       << "socket: \"" << p.socket << "\"\n"
       << "socket_mode: \"0660\"\n"
       << "metadata_store: \"" << c.StoreUrl() << "\"\n"
       << "pool: " << pool << "\n"
       << "metrics_listen: 127.0.0.1:" << port << "\n";
  if (!mounts.empty()) yaml << "mounts: \"" << mounts << "\"\n";
  // The socket is the job user's: it serves the datasets checked above and
  // no other of the pool.
  std::string served;
  for (const JobDataset& d : datasets) served += (served.empty() ? "" : ",") + d.dataset;
  yaml << "datasets: \"" << served << "\"\n";
  // The sidecar runs as root: it proves the cluster key to the cache nodes.
  if (const std::string key = c.ClusterKeyPath(); !key.empty()) {
    GRANARY_RETURN_IF_ERROR(c.CheckClusterKey());  // a key that will not load: say so now
    yaml << "cluster_key_file: \"" << key << "\"\n";
  }
  if (const std::string ca = c.TlsCaPath(); !ca.empty()) {
    yaml << "tls_ca_file: \"" << ca << "\"\n";
  }
  GRANARY_RETURN_IF_ERROR(WriteFileAtomically(p.config, yaml.str(), 0600));
  GRANARY_ASSIGN_OR_RETURN(pid_t pid, SpawnSidecar(o.sidecar_binary, p));
  GRANARY_RETURN_IF_ERROR(WriteFileAtomically(p.pid_file, std::to_string(pid) + "\n", 0600));

  const Clock::time_point deadline = Clock::now() + timeout;
  int last = 0;
  while (true) {
    int wstatus = 0;
    if (::waitpid(pid, &wstatus, WNOHANG) == pid) {
      ::unlink(p.pid_file.c_str());
      return Status::Unavailable("job " + o.job_id + ": the sidecar exited at start-up (" +
                                 (WIFEXITED(wstatus)
                                      ? "exit status " + std::to_string(WEXITSTATUS(wstatus))
                                      : "signal " + std::to_string(WTERMSIG(wstatus))) +
                                 "); its log " + Quoted(p.log) + " ends:\n" + LogTail(p.log));
    }
    last = ReadyzStatus(port);
    if (last == 200) break;
    if (Clock::now() >= deadline) {
      return Status::DeadlineExceeded(
          "job " + o.job_id + ": the sidecar was not ready within " +
          std::to_string(timeout.count()) + " ms (/readyz " +
          (last == 0 ? std::string("not answering") : std::to_string(last)) +
          "; raise --timeout in prolog.sh if the store or mounts are slow); its log " +
          Quoted(p.log) + " ends:\n" + LogTail(p.log));
    }
    std::this_thread::sleep_for(kPollEvery * 2);
  }
  // The job's processes connect as its user.
  if (::chown(p.socket.c_str(), uid, gid) != 0) {
    return Status::FromErrno(errno, "job " + o.job_id + ": giving the socket " + Quoted(p.socket) +
                                        " to uid " + std::to_string(uid));
  }
  *started = "job " + o.job_id + ": sidecar " + std::to_string(pid) + " serving pool " + pool +
             " on " + p.socket;
  if (!mounts.empty()) *started += "; mounted " + mounts;
  return Status::Ok();
}

}  // namespace

Result<uint32_t> ParseUserOrGroupId(const std::string& text, const std::string& what) {
  uint32_t v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end || v == 0xffffffffu) {
    return Status::InvalidArgument(what + " " + Quoted(text) +
                                   " is not a numeric id; Slurm passes the job's uid and gid "
                                   "($SLURM_JOB_UID and $SLURM_JOB_GID in prolog.sh)");
  }
  return v;
}

Result<JobUser> ResolveJobUser(uint32_t uid, uint32_t gid) {
  GRANARY_ASSIGN_OR_RETURN(Identity identity, ResolveOwnerIdentity(uid, gid));
  return JobUser{identity.uid, identity.gid, std::move(identity.groups), std::move(identity.name)};
}

Status SlurmProlog(NodeAgentContext& c, const SlurmNodeOptions& o) {
  GRANARY_RETURN_IF_ERROR(CheckCommon(o));
  GRANARY_ASSIGN_OR_RETURN(uint32_t uid, ParseUserOrGroupId(o.uid, "--uid"));
  GRANARY_ASSIGN_OR_RETURN(uint32_t gid, ParseUserOrGroupId(o.gid, "--gid"));
  GRANARY_ASSIGN_OR_RETURN(milliseconds timeout, ParseDuration(o.timeout));
  if (!o.log_dir.starts_with('/')) {
    return Status::InvalidArgument("--log-dir " + Quoted(o.log_dir) + " is not an absolute path");
  }
  std::vector<JobDataset> datasets;
  std::string pool;
  GRANARY_RETURN_IF_ERROR(FindJobDatasets(c, o, uid, gid, &datasets, &pool));
  if (pool.empty()) {
    c.out() << "job " << o.job_id << ": no #DW directives; nothing to do\n";
    return Status::Ok();
  }
  // A requeued job runs its prolog again: leftovers of the last run go first.
  std::string cleaned;
  GRANARY_RETURN_IF_ERROR(CleanUpJob(o, timeout, &cleaned));
  std::string placed;
  GRANARY_RETURN_IF_ERROR(PlaceOnThisNode(c, o, datasets, pool, &placed));
  std::string started;
  Status s = StartJobSidecar(c, o, pool, datasets, uid, gid, timeout, &started);
  if (!s.ok()) {
    std::string ignored;
    Status cleanup = CleanUpJob(o, timeout, &ignored);
    if (!cleanup.ok()) return s.WithContext("(and cleaning up: " + cleanup.message() + ")");
    return s;
  }
  c.out() << started << placed << "\n";
  return Status::Ok();
}

Status SlurmEpilog(NodeAgentContext& c, const SlurmNodeOptions& o) {
  GRANARY_RETURN_IF_ERROR(CheckCommon(o));
  GRANARY_ASSIGN_OR_RETURN(milliseconds timeout, ParseDuration(o.timeout));
  std::string done;
  GRANARY_RETURN_IF_ERROR(CleanUpJob(o, timeout, &done));
  c.out() << "job " << o.job_id << ": " << (done.empty() ? "nothing running; " : done) << "removed "
          << PathsOf(o).job_dir << "\n";
  return Status::Ok();
}

}  // namespace granary::slurm

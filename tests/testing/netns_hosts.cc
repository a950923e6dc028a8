#include "testing/netns_hosts.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "granary/core/file.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr char kRunTag[] = "gn";         // every run's names start with it
constexpr size_t kPidDigits = 6;         // pid_max is at most 2^22 = 0x400000
constexpr milliseconds kIpTimeout = 5s;  // one `ip` call

std::string Joined(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& a : argv) out += (out.empty() ? "" : " ") + a;
  return out;
}

Result<std::string> Ip(std::vector<std::string> args) {
  args.insert(args.begin(), IpBinary());
  return RunCommand(args, kIpTimeout);
}

// Lines of `ip netns list`: "name" or "name (id: 3)"; the names.
Result<std::vector<std::string>> Namespaces() {
  GRANARY_ASSIGN_OR_RETURN(std::string out, Ip({"netns", "list"}));
  std::vector<std::string> names;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    const std::string name = line.substr(0, line.find(' '));
    if (!name.empty()) names.push_back(name);
  }
  return names;
}

// Interface names of `ip -o link show` ("7: name@peer: <...>").
Result<std::vector<std::string>> Links() {
  GRANARY_ASSIGN_OR_RETURN(std::string out, Ip({"-o", "link", "show"}));
  std::vector<std::string> names;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t start = line.find(": ");
    if (start == std::string::npos) continue;
    const size_t end = line.find_first_of("@:", start + 2);
    names.push_back(line.substr(start + 2, end - start - 2));
  }
  return names;
}

// The process ids inside a namespace (`ip netns pids`).
std::vector<pid_t> PidsIn(const std::string& netns) {
  std::vector<pid_t> pids;
  auto out = Ip({"netns", "pids", netns});
  if (!out.ok()) return pids;
  std::istringstream words(*out);
  long pid = 0;
  while (words >> pid) pids.push_back(static_cast<pid_t>(pid));
  return pids;
}

// Kills everything inside `netns` and waits (bounded) until nothing is left:
// a namespace with a process in it outlives `ip netns del`, veth and all.
Status EmptyNamespace(const std::string& netns) {
  const auto deadline = steady_clock::now() + 5s;
  std::vector<pid_t> left;
  while (true) {
    left = PidsIn(netns);
    if (left.empty()) return Status::Ok();
    for (pid_t pid : left) ::kill(pid, SIGKILL);
    if (steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(50ms);
  }
  std::string pids;
  for (pid_t pid : left) pids += " " + std::to_string(pid);
  return Status::DeadlineExceeded("namespace " + netns + " still holds processes" + pids +
                                  " 5 s after SIGKILL");
}

// Deletes the namespaces and interfaces whose names start with `prefix`:
// processes first, then veths (which takes their peers), namespaces, the
// rest. What is still there afterwards is the error.
Status RemoveByPrefix(const std::string& prefix) {
  const auto ours = [&](const std::string& name) { return name.rfind(prefix, 0) == 0; };
  Status first;
  const auto note = [&](const Status& s) {
    if (first.ok() && !s.ok()) first = s;
  };
  auto namespaces = Namespaces();
  note(namespaces.status());
  std::vector<std::string> our_namespaces;
  if (namespaces.ok()) {
    for (const std::string& ns : *namespaces) {
      if (ours(ns)) our_namespaces.push_back(ns);
    }
  }
  for (const std::string& ns : our_namespaces) note(EmptyNamespace(ns));
  if (auto links = Links(); links.ok()) {
    for (const std::string& link : *links) {  // veths before the bridge
      if (ours(link) && !link.ends_with("br")) (void)Ip({"link", "del", link});
    }
    for (const std::string& link : *links) {
      if (ours(link) && link.ends_with("br")) (void)Ip({"link", "del", link});
    }
  }
  for (const std::string& ns : our_namespaces) (void)Ip({"netns", "del", ns});

  // The scan: nothing with the prefix may be left.
  std::vector<std::string> left;
  if (auto after = Namespaces(); after.ok()) {
    for (const std::string& ns : *after) {
      if (ours(ns)) left.push_back("namespace " + ns);
    }
  } else {
    note(after.status());
  }
  if (auto after = Links(); after.ok()) {
    for (const std::string& link : *after) {
      if (ours(link)) left.push_back("interface " + link);
    }
  } else {
    note(after.status());
  }
  if (!left.empty()) {
    std::string what;
    for (const std::string& l : left) what += (what.empty() ? "" : ", ") + l;
    return Status::Internal("removing the network of run " + prefix + " left " + what);
  }
  return first;
}

// The 6-hex-digit pid in a name "gn<pid>...", or -1.
pid_t RunPidOf(const std::string& name) {
  if (name.size() < 2 + kPidDigits || name.rfind(kRunTag, 0) != 0) return -1;
  const std::string hex = name.substr(2, kPidDigits);
  if (hex.find_first_not_of("0123456789abcdef") != std::string::npos) return -1;
  return static_cast<pid_t>(std::strtol(hex.c_str(), nullptr, 16));
}

// Whether process `pid` has ended: no such process, or a zombie nobody
// reaped (in a container whose init does not reap, a killed test stays one).
bool ProcessGone(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  auto stat = ReadFileToString("/proc/" + std::to_string(pid) + "/stat");
  if (!stat.ok()) return false;
  const size_t paren = stat->rfind(") ");  // "pid (comm) S ...": comm may hold ") "
  return paren != std::string::npos && paren + 2 < stat->size() &&
         (stat->at(paren + 2) == 'Z' || stat->at(paren + 2) == 'X');
}

// A 10.x.y.0/24 that no address or route of the root namespace mentions;
// "10.x.y." returned.
Result<std::string> FreeSubnet() {
  GRANARY_ASSIGN_OR_RETURN(std::string addresses, Ip({"-o", "addr", "show"}));
  GRANARY_ASSIGN_OR_RETURN(std::string routes, Ip({"-4", "route", "show", "table", "all"}));
  std::random_device seed;
  std::mt19937 rng(seed());
  for (int attempt = 0; attempt < 100; ++attempt) {
    // x in [64, 250): away from the 10.0.x.y and 10.1.x.y many setups use.
    const std::string net =
        "10." + std::to_string(64 + rng() % 186) + "." + std::to_string(rng() % 256) + ".";
    const std::string probe = " " + net;
    if (addresses.find(probe) == std::string::npos &&
        ("\n" + routes).find("\n" + net) == std::string::npos &&
        routes.find(probe) == std::string::npos) {
      return net;
    }
  }
  return Status::ResourceExhausted("no free 10.x.y.0/24 found in 100 random tries");
}

}  // namespace

Result<std::string> RunCommand(const std::vector<std::string>& argv, milliseconds timeout) {
  const std::string command = Joined(argv);
  if (argv.empty()) return Status::InvalidArgument("run a command: no argv");
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return Status::FromErrno(errno, "pipe for " + command);
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (std::string& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(out[0]);
    ::close(out[1]);
    return Status::FromErrno(err, "fork for " + command);
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, 0);
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    ::execvp(cargv[0], cargv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  const auto deadline = steady_clock::now() + timeout;
  std::string output;
  bool timed_out = false;
  while (true) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd pfd{out[0], POLLIN, 0};
    const int n = ::poll(&pfd, 1, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;  // the deadline is checked above
    char buf[4096];
    const ssize_t got = ::read(out[0], buf, sizeof(buf));
    if (got > 0) {
      output.append(buf, static_cast<size_t>(got));
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    break;  // end of file: the command (and whatever shared its output) is done
  }
  ::close(out[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int wstatus = 0;
  while (::waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return Status::DeadlineExceeded(command + ": no end within " + std::to_string(timeout.count()) +
                                    " ms; it said: " + output);
  }
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    const std::string how = WIFEXITED(wstatus) ? "exit code " + std::to_string(WEXITSTATUS(wstatus))
                                               : "signal " + std::to_string(WTERMSIG(wstatus));
    return Status::FailedPrecondition(command + ": " + how + (output.empty() ? "" : ": ") + output);
  }
  return output;
}

std::string IpBinary() {
  for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (::access(path, X_OK) == 0) return path;
  }
  return "ip";
}

std::optional<std::string> NetnsHosts::Unavailable() {
  if (::geteuid() != 0) {
    return "network namespaces need root (CAP_NET_ADMIN, CAP_SYS_ADMIN); euid is " +
           std::to_string(::geteuid());
  }
  const std::string probe = std::string(kRunTag) + "probe" + std::to_string(::getpid());
  auto added = Ip({"netns", "add", probe});
  if (!added.ok()) return "`ip netns add` failed: " + added.status().ToString();
  (void)Ip({"netns", "del", probe});
  return std::nullopt;
}

Status NetnsHosts::RemoveStaleRuns() {
  std::set<std::string> prefixes;  // "gn<pid>" of runs whose process is gone
  const auto consider = [&](const std::string& name) {
    const pid_t pid = RunPidOf(name);
    if (pid > 0 && ProcessGone(pid)) {
      prefixes.insert(name.substr(0, 2 + kPidDigits));
    }
  };
  GRANARY_ASSIGN_OR_RETURN(std::vector<std::string> namespaces, Namespaces());
  GRANARY_ASSIGN_OR_RETURN(std::vector<std::string> links, Links());
  for (const std::string& n : namespaces) consider(n);
  for (const std::string& l : links) consider(l);
  for (const std::string& prefix : prefixes) {
    GRANARY_RETURN_IF_ERROR(RemoveByPrefix(prefix).WithContext("remove a stale run's network"));
  }
  return Status::Ok();
}

Result<std::unique_ptr<NetnsHosts>> NetnsHosts::Create(size_t hosts) {
  if (hosts == 0 || hosts > 9) {
    return Status::InvalidArgument("NetnsHosts: 1 to 9 hosts, not " + std::to_string(hosts));
  }
  GRANARY_RETURN_IF_ERROR(RemoveStaleRuns());
  std::unique_ptr<NetnsHosts> made(new NetnsHosts());
  static std::atomic<unsigned> runs{0};
  char prefix[32];
  std::snprintf(prefix, sizeof(prefix), "%s%06x%c", kRunTag, static_cast<unsigned>(::getpid()),
                "0123456789abcdefghijklmnopqrstuvwxyz"[runs++ % 36]);
  made->prefix_ = prefix;
  // A half-made network is removed by the destructor of `made`.
  GRANARY_RETURN_IF_ERROR(made->Build(hosts).WithContext("make " + std::to_string(hosts) +
                                                         " hosts in network namespaces"));
  return made;
}

Status NetnsHosts::Build(size_t hosts) {
  // A prefix still in use (a counter that wrapped) is cleared first.
  GRANARY_RETURN_IF_ERROR(RemoveByPrefix(prefix_));
  GRANARY_ASSIGN_OR_RETURN(const std::string net, FreeSubnet());
  bridge_ = prefix_ + "br";
  bridge_address_ = net + "1";
  GRANARY_RETURN_IF_ERROR(
      Ip({"link", "add", "name", bridge_, "type", "bridge", "forward_delay", "0"}).status());
  GRANARY_RETURN_IF_ERROR(Ip({"addr", "add", bridge_address_ + "/24", "dev", bridge_}).status());
  GRANARY_RETURN_IF_ERROR(Ip({"link", "set", bridge_, "up"}).status());
  for (size_t i = 0; i < hosts; ++i) {
    NetnsHost h;
    h.netns = prefix_ + "n" + std::to_string(i);
    h.link = prefix_ + "v" + std::to_string(i);
    h.peer = prefix_ + "h" + std::to_string(i);
    h.address = net + std::to_string(i + 2);
    hosts_.push_back(h);
    GRANARY_RETURN_IF_ERROR(Ip({"netns", "add", h.netns}).status());
    GRANARY_RETURN_IF_ERROR(
        Ip({"link", "add", h.link, "type", "veth", "peer", "name", h.peer}).status());
    GRANARY_RETURN_IF_ERROR(Ip({"link", "set", h.peer, "netns", h.netns}).status());
    GRANARY_RETURN_IF_ERROR(Ip({"link", "set", h.link, "master", bridge_}).status());
    GRANARY_RETURN_IF_ERROR(Ip({"link", "set", h.link, "up"}).status());
    GRANARY_RETURN_IF_ERROR(
        Ip({"-n", h.netns, "addr", "add", h.address + "/24", "dev", h.peer}).status());
    GRANARY_RETURN_IF_ERROR(Ip({"-n", h.netns, "link", "set", h.peer, "up"}).status());
    GRANARY_RETURN_IF_ERROR(Ip({"-n", h.netns, "link", "set", "lo", "up"}).status());
  }
  return Status::Ok();
}

NetnsHosts::~NetnsHosts() {
  if (Status s = Destroy(); !s.ok()) ADD_FAILURE() << s.ToString();
}

std::vector<std::string> NetnsHosts::ExecPrefix(size_t i) const {
  return {IpBinary(), "netns", "exec", hosts_.at(i).netns};
}

Status NetnsHosts::CutLink(size_t i) {
  return Ip({"link", "set", hosts_.at(i).link, "down"})
      .status()
      .WithContext("cut host " + std::to_string(i));
}

Status NetnsHosts::RestoreLink(size_t i) {
  return Ip({"link", "set", hosts_.at(i).link, "up"})
      .status()
      .WithContext("restore host " + std::to_string(i));
}

Status NetnsHosts::Destroy() {
  if (destroyed_ || prefix_.empty()) return Status::Ok();
  destroyed_ = true;
  return RemoveByPrefix(prefix_);
}

}  // namespace granary::testing

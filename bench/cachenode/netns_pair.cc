#include "netns_pair.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "granary/core/file.h"

namespace granary::cachenode_bench {
namespace {

// Runs `ip args...` to its end within 10 s; its output is discarded.
Status Ip(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  std::string ip = "ip";
  argv.push_back(ip.data());
  std::vector<std::string> copy = args;
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::string command = "ip";
  for (const std::string& a : args) command += " " + a;
  const pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno(errno, "fork for `" + command + "`");
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) {
      ::dup2(null, 1);
      ::dup2(null, 2);
    }
    ::execvp("ip", argv.data());
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  int status = 0;
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return Status::DeadlineExceeded("`" + command + "` took over 10 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Status::FailedPrecondition("`" + command + "` failed (exit " +
                                      std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
                                      "); --netns needs root and iproute2");
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<NetnsPair>> NetnsPair::Create() {
  std::unique_ptr<NetnsPair> pair(new NetnsPair());
  char prefix[16];
  std::snprintf(prefix, sizeof(prefix), "gb%06x", static_cast<unsigned>(::getpid()) & 0xffffff);
  std::mt19937 random(std::random_device{}());
  const std::string net =
      "10." + std::to_string(200 + random() % 50) + "." + std::to_string(random() % 250) + ".";
  for (int side = 0; side < 2; ++side) {
    pair->name_[side] = std::string(prefix) + (side == 0 ? "a" : "b");
    pair->address_[side] = net + std::to_string(side + 1);
    GRANARY_RETURN_IF_ERROR(Ip({"netns", "add", pair->name_[side]}));
  }
  const std::string veth[2] = {pair->name_[0] + "0", pair->name_[1] + "0"};
  GRANARY_RETURN_IF_ERROR(Ip({"link", "add", veth[0], "netns", pair->name_[0], "type", "veth",
                              "peer", "name", veth[1], "netns", pair->name_[1]}));
  for (int side = 0; side < 2; ++side) {
    const std::string& ns = pair->name_[side];
    GRANARY_RETURN_IF_ERROR(
        Ip({"-n", ns, "addr", "add", pair->address_[side] + "/24", "dev", veth[side]}));
    GRANARY_RETURN_IF_ERROR(Ip({"-n", ns, "link", "set", veth[side], "up"}));
    GRANARY_RETURN_IF_ERROR(Ip({"-n", ns, "link", "set", "lo", "up"}));
  }
  return pair;
}

NetnsPair::~NetnsPair() {
  for (const std::string& name : name_) {
    if (!name.empty()) (void)Ip({"netns", "del", name});
  }
}

Status NetnsPair::In(int side, const std::function<Status()>& fn) const {
  const std::string path = "/var/run/netns/" + name_[side];
  ScopedFd target(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!target.valid()) return Status::FromErrno(errno, "open " + path);
  ScopedFd home(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
  if (!home.valid()) return Status::FromErrno(errno, "open /proc/thread-self/ns/net");
  if (::setns(target.get(), CLONE_NEWNET) != 0) {
    return Status::FromErrno(errno, "enter network namespace " + name_[side]);
  }
  Status status = fn();
  if (::setns(home.get(), CLONE_NEWNET) != 0) {
    // The thread cannot get back: nothing it makes later would be where it
    // belongs. Stop here rather than measure the wrong thing.
    std::perror("cachenode_bench: leave a network namespace");
    std::abort();
  }
  return status;
}

}  // namespace granary::cachenode_bench

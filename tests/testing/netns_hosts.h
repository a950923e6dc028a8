#pragma once

// NetnsHosts: 3 or 4 "hosts" on one machine, for tests of cache nodes across
// real network boundaries (tests/integration/multihost_test.cc). Each host is
// a network namespace with one veth whose peer sits on a bridge in the root
// namespace, and one address on a private /24 chosen at random among
// 10.x.y.0/24 not already on this machine:
//
//   root namespace            host i (netns <prefix>n<i>)
//   bridge <prefix>br  ----- <prefix>v<i> === <prefix>h<i>  10.x.y.(i+2)
//   10.x.y.1                                  lo up
//
// The test process stays in the root namespace and reaches every host
// through the bridge (10.x.y.1 is the root's address on it): Redis listens
// there, readers and /metrics scrapes go straight to the hosts' addresses.
// Daemons run inside a host through ExecPrefix(i) (`ip netns exec <netns>`,
// which execs the daemon in place, so the pid the test holds is the
// daemon's); see TestDaemon::RunThrough and BindTo in cachenode_fixture.h.
// Unix sockets are paths, not network objects: a sidecar's socket inside a
// host is reached from the root namespace as usual.
//
// CutLink(i) sets the bridge-side veth of host i down: its TCP connections
// hang as across a pulled cable (no reset, no error), which is not a kill.
// RestoreLink(i) sets it up again.
//
// Names: every namespace and interface of a run starts with the run's
// prefix, "gn" + the test process's pid in 6 hex digits + a per-process
// counter (at most 11 characters before the suffix, so interface names stay
// within 15). Cleanup is bounded (each `ip` call has a deadline) and leaves
// nothing behind: Destroy() (also the destructor, also after a Create that
// failed half way) kills every process inside the run's namespaces, deletes
// the veths, namespaces and bridge, then scans `ip netns list` and `ip link`
// for anything else with the prefix. Create() first removes what runs whose
// process is gone (SIGKILLed by a ctest timeout) left behind.
//
// The network is the same whatever the nodes are read over: multihost_test
// runs each case over TCP and over libfabric (its tcp provider).
//
// Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN for `ip netns`); Unavailable()
// says why not, for GTEST_SKIP.
//
// Thread safety: the test's main thread owns it; the accessors may be read
// from any thread.

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "granary/core/status.h"

namespace granary::testing {

// Runs argv[0] (looked up in $PATH) to its end, stdout and stderr captured
// together. kDeadlineExceeded (after SIGKILL) past `timeout`; a non-zero exit
// is kFailedPrecondition with the command and its output.
Result<std::string> RunCommand(const std::vector<std::string>& argv,
                               std::chrono::milliseconds timeout = std::chrono::seconds(10));

// The `ip` binary (iproute2): /usr/sbin/ip, /sbin/ip, or "ip" on $PATH.
std::string IpBinary();

struct NetnsHost {
  std::string netns;    // the network namespace, for `ip netns exec`
  std::string address;  // its IPv4 address on the bridge, "10.x.y.z"
  std::string link;     // the bridge-side end of its veth (CutLink sets it down)
  std::string peer;     // the host-side end, inside `netns`
};

class NetnsHosts {
 public:
  // Why hosts cannot be made here (not root, no `ip`, `ip netns add`
  // refused), or nullopt. Tries a namespace and removes it.
  static std::optional<std::string> Unavailable();

  // The bridge, `hosts` namespaces with their veths and addresses, links and
  // `lo` up. On failure everything made so far is removed.
  static Result<std::unique_ptr<NetnsHosts>> Create(size_t hosts);

  // Destroy(); a failure to clean up fails the current test.
  ~NetnsHosts();
  NetnsHosts(const NetnsHosts&) = delete;
  NetnsHosts& operator=(const NetnsHosts&) = delete;

  const std::string& prefix() const { return prefix_; }
  const std::string& bridge() const { return bridge_; }
  // The root namespace's address on the bridge, reachable from every host.
  const std::string& bridge_address() const { return bridge_address_; }
  size_t host_count() const { return hosts_.size(); }
  const NetnsHost& host(size_t i) const { return hosts_.at(i); }

  // {ip, "netns", "exec", <netns of host i>}: put before a command's argv.
  std::vector<std::string> ExecPrefix(size_t i) const;

  // Host i's link on the bridge down (the host is cut off) or up again.
  Status CutLink(size_t i);
  Status RestoreLink(size_t i);

  // Kills the processes inside the run's namespaces, deletes its interfaces
  // and namespaces, and checks that nothing with the prefix is left.
  // Idempotent; bounded by the `ip` calls' deadlines (a few seconds).
  Status Destroy();

  // Removes namespaces and interfaces of runs whose test process no longer
  // exists (names "gn<pid>..." whose pid is gone or a zombie). Called by
  // Create().
  static Status RemoveStaleRuns();

 private:
  NetnsHosts() = default;
  Status Build(size_t hosts);

  std::string prefix_;
  std::string bridge_;
  std::string bridge_address_;
  std::vector<NetnsHost> hosts_;
  bool destroyed_ = false;
};

}  // namespace granary::testing

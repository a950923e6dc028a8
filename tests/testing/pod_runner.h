#pragma once

// PodRunner: runs Granary's own pods for real on a KubeCluster. kwok only
// pretends to run pods (it sets their status); this runs the containers of
// Granary images as local processes built by this tree, from the pod specs
// the real API server returns, so what the operator, the DaemonSets and the
// webhook generate is what runs.
//
//   PodRunner runner(*cluster, {.images = {{"granary", "<build>/bin-dir"}}});
//   ASSERT_OK(runner.Start());
//   ... kubectl apply a DaemonSet whose pods use image granary/granary-cachenode ...
//   ASSERT_OK(runner.WaitForRunning(PodRunner::InNamespace("granary-system"), 2, 60s));
//
// What it runs. A background thread lists the pods bound to a node (every
// poll_interval; one HTTPS request with the cluster's admin certificate).
// A container runs here when its image matches a prefix of options.images
// (at the start of the image reference or after a '/', so "granary" matches
// "granary/test:dev" and "ghcr.io/x/granary-cachenode:1"); the binary is the
// base name of its command[0] (or, with no command, of the image's last path
// component without its tag) looked up in that prefix's directory. Other
// containers and pods are left to kwok. Init containers of Granary images run
// first, in order, each to a successful exit; native sidecars (init
// containers with restartPolicy: Always) are started in order and keep
// running, and those after a native sidecar start once its startupProbe
// passes (an httpGet on 127.0.0.1, tried every poll; other probe kinds are
// not run), as the kubelet does; then the regular containers start. No other
// probe is run: kwok reports the pod Running and Ready.
//
// What the process sees:
// - argv: the binary, then command[1..] and args, with $(VAR) references
//   expanded from the container's environment as the kubelet does.
// - environment: only what a container would get: PATH, HOME, HOSTNAME (the
//   pod's name), KUBERNETES_SERVICE_HOST/PORT (127.0.0.1 and the API
//   server's port, so in-cluster configuration reaches the real API server
//   with the CA of the kube-root-ca.crt ConfigMap), the test's sanitizer
//   options and TMPDIR, then env and envFrom: literal values,
//   secretKeyRef, configMapKeyRef and fieldRef (metadata.name, .namespace,
//   .uid, .labels['k'], .annotations['k'], spec.nodeName,
//   spec.serviceAccountName, status.podIP and status.hostIP = 127.0.0.1).
// - volumes at their mountPaths (subPath and readOnly honoured): ConfigMap
//   and Secret volumes (items, keys and modes honoured; optional ones may be
//   missing) and projected volumes (configMap, secret, downwardAPI, and
//   serviceAccountToken from the TokenRequest API, bound to the pod, so the
//   admission-injected kube-api-access volume works) are written as files
//   under this runner's TempDir once, when the pod starts; downwardAPI volumes
//   likewise; emptyDir is a directory there shared by the pod's containers;
//   hostPath is the host path itself (tests pass TempDirs; DirectoryOrCreate
//   and FileOrCreate create it). Other volume types (PVCs) are an error for
//   that pod.
// - securityContext.runAsUser/runAsGroup (the container's, else the pod's)
//   through setpriv; workingDir.
//
// How the paths stay real. Each container runs in its own mount namespace:
// it is started as `unshare --mount --propagation private` (so / is
// rprivate and nothing leaks to the host), a /bin/sh step bind-mounts each
// volume at its mountPath (remounting read-only ones read-only), and execs
// the binary. The process therefore reads /etc/granary/cachenode.yaml, as
// the pod spec says, and no path in the spec is rewritten. The alternatives
// were worse: rewriting paths in argv and config files changes what is
// tested, and a chroot would need a whole root file system. The price: it
// needs CAP_SYS_ADMIN (Start fails with kFailedPrecondition otherwise, for
// GTEST_SKIP), and a mountPath missing on the host must exist as a mount
// point: it is created (with missing parents) in the host's file system
// before the container starts and removed (if still empty) when the pod
// stops. Two tests that use the same missing mountPath at the same time may
// race on that removal.
//
// Lifecycle. A pod deleted from the API server, marked for deletion
// (deletionTimestamp), replaced (a new UID under the same name), moved off
// the nodes served or finished (Succeeded/Failed) has its processes stopped:
// SIGTERM, then SIGKILL after its terminationGracePeriodSeconds, at most
// options.max_stop_timeout. A process that exits is restarted per the pod's
// restartPolicy (Always; OnFailure on a non-zero exit; Never not), after a
// backoff that doubles from initial_backoff to max_backoff and resets after
// 10 s of running. Volumes and ConfigMap-fed environment are read when the
// pod starts, not refreshed. Status stays kwok's: a restart or a failed exit
// is visible through Exits() and the logs, not in the pod's status, and the
// pod is Ready as soon as kwok says so, before the process is. By default
// kwok also marks a Job's pods Succeeded at once, which stops them here.
//
// Pods that run to their end (options.report_completion, on a cluster with
// KubeClusterOptions::kwok_completes_job_pods = false): a pod with
// restartPolicy Never or OnFailure whose every regular container runs here
// ends when each of them has exited for good. The runner then stops the
// native sidecars (as for a deleted pod) and writes the pod's terminal
// status (Succeeded or Failed, each container terminated with its exit code)
// through the status subresource, as a kubelet does, so a Job completes or
// fails by what its processes did. It waits for kwok to have reported the
// pod Running first, so kwok's "ready" stage cannot write over it; a failed
// write is retried at the next poll. A pod that has a container this runner
// does not run (kwok's) is never reported, and an init container that fails
// under Never stops the pod here without being reported.
//
// Every fake node runs its pods on this one host: two pods that listen on the
// same fixed port (a cache-node DaemonSet on two nodes) conflict. Restrict
// options.nodes, or give them different ports.
//
// Logs. Each container's stdout and stderr go to a file under dir()/logs
// (appended across restarts). If the test has failed when the runner stops,
// the tail of every container's log and the runner's own event log (what it
// started, stopped and could not run, with why) are printed.
//
// Thread safety: Start, Stop, PrintLogsIfTestFailed and the destructor
// belong to the test's thread; Running, Exits, WaitForRunning, WaitFor,
// EventLog and dir may be called from any thread. The processes are started
// by the runner's thread (they die with it: PR_SET_PDEATHSIG, except those
// that change user, which Stop still ends).

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "granary/core/status.h"
#include "testing/kube_cluster.h"
#include "testing/test_util.h"

namespace granary::testing {

struct PodRunnerOptions {
  // Image-name prefix -> directory of built binaries (granary-cachenode,
  // granary-sidecar, granary, ...).
  std::map<std::string, std::string> images;
  // Only pods bound to these nodes run here; empty: every node.
  std::set<std::string> nodes;
  std::chrono::milliseconds poll_interval{250};
  std::chrono::milliseconds max_stop_timeout{10000};
  std::chrono::milliseconds initial_backoff{500};
  std::chrono::milliseconds max_backoff{8000};
  // Whether this runner writes the end of the pods it runs to completion
  // (restartPolicy Never or OnFailure, every regular container run here):
  // when each regular container has exited for good (exit 0; under Never,
  // any exit), it stops the pod's native sidecars (SIGTERM, as for a
  // deleted pod) and writes, through the pod's status subresource, phase
  // Succeeded if every regular container exited 0 and Failed otherwise,
  // with each container terminated (exitCode, reason Completed or Error; a
  // signal is 128 + its number) and Ready/ContainersReady False. A Job's
  // controller then completes or fails the Job. Needs a cluster started with
  // kwok_completes_job_pods = false (else kwok has marked a Job's pods
  // Succeeded before they end). Off by default: the pods' status stays
  // kwok's, as the suites written before it expect.
  bool report_completion = false;
};

// A container process this runner runs now.
struct RunningContainer {
  std::string ns;
  std::string pod;
  std::string uid;  // the pod's
  std::string node;
  std::string container;
  std::map<std::string, std::string> labels;  // the pod's
  bool init = false;                          // an init container (a native sidecar, usually)
  pid_t pid = -1;
  std::string log_path;
  int restarts = 0;  // how often this runner restarted it
};

// A container process that ended (and why), oldest first.
struct ContainerExit {
  std::string ns;
  std::string pod;
  std::string container;
  std::string status;  // "exit code 2", "killed by signal 15 (Terminated)"
  bool exited = false;
  int code = -1;
  bool stopped = false;  // ended because this runner stopped it
  std::string log_path;
};

class PodRunner {
 public:
  PodRunner(const KubeCluster& cluster, PodRunnerOptions options);
  PodRunner(const KubeCluster& cluster, std::map<std::string, std::string> images);
  // Stop(), and the logs if the test failed.
  ~PodRunner();
  PodRunner(const PodRunner&) = delete;
  PodRunner& operator=(const PodRunner&) = delete;

  // Checks that containers can get mount namespaces (kFailedPrecondition
  // if not: not root / no CAP_SYS_ADMIN) and that every image directory
  // exists, then starts the runner's thread.
  Status Start();
  // Stops every process (SIGTERM, then SIGKILL, bounded), removes the mount
  // points it created and ends the thread. Idempotent.
  void Stop();

  std::vector<RunningContainer> Running() const;
  std::vector<ContainerExit> Exits() const;

  // Waits until at least `count` running containers match `match`:
  // kDeadlineExceeded with what runs and the recent events otherwise.
  Status WaitForRunning(const std::function<bool(const RunningContainer&)>& match, size_t count,
                        std::chrono::milliseconds timeout) const;
  // Waits until `condition` (given what runs) holds, e.g. until nothing of
  // a deleted pod runs any more.
  Status WaitFor(const std::function<bool(const std::vector<RunningContainer>&)>& condition,
                 std::chrono::milliseconds timeout, const std::string& what) const;

  // Predicates for WaitForRunning.
  static std::function<bool(const RunningContainer&)> Pod(const std::string& ns,
                                                          const std::string& name);
  static std::function<bool(const RunningContainer&)> InNamespace(const std::string& ns);
  static std::function<bool(const RunningContainer&)> WithLabel(const std::string& key,
                                                                const std::string& value);

  // What the runner did and could not do, one line per event.
  std::string EventLog() const;
  const std::string& dir() const { return dir_.path(); }

  // Prints every container's log tail and the event log if the test has
  // failed (once); the destructor does the same.
  void PrintLogsIfTestFailed();

 private:
  struct PodState;
  struct ContainerState;

  void Loop();
  void Poll();
  Status SetUpPod(PodState* pod);
  void StepPod(PodState* pod);
  Status StartContainer(PodState* pod, ContainerState* c);
  void ReapContainer(PodState* pod, ContainerState* c);
  void StopPod(PodState* pod, const std::string& why);
  bool RegularContainersEnded(const PodState& pod) const;
  void ReportCompletion(PodState* pod);
  void CleanUpPod(PodState* pod);
  void RetireProcess(ContainerState* c);
  void PublishSnapshot();
  void Event(const std::string& line);
  void Problem(PodState* pod, const std::string& line);
  std::string ImageDir(const std::string& image) const;

  const KubeCluster& cluster_;
  PodRunnerOptions options_;
  TempDir dir_;

  std::thread thread_;  // runs Loop()
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_requested_ = false;  // guarded by stop_mu_
  bool started_ = false;         // test thread only

  // Owned by the runner's thread.
  std::map<std::string, std::unique_ptr<PodState>> pods_;  // by pod UID

  mutable std::mutex mu_;                  // guards the members below
  std::vector<RunningContainer> running_;  // what Running() answers
  std::vector<ContainerExit> exits_;
  std::vector<std::string> events_;
  std::vector<std::string> all_logs_;   // every container log path, for printing
  std::set<std::string> printed_logs_;  // printed by DaemonProcess already
  bool logs_printed_ = false;
};

}  // namespace granary::testing

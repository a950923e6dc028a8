#pragma once

// SidecarProcess: a real granary-sidecar for integration tests, next to a
// CacheCluster's cache nodes (cachenode_fixture.h).
//
//   SidecarOptions o;
//   o.store_url = cluster->store_url();
//   SidecarProcess sidecar(o, cluster->dir() + "/sidecar");
//   ASSERT_OK(sidecar.StartAndWaitReady());
//   // clients connect to sidecar.socket_path()
//   auto pins = sidecar.MetricValue("granary_sidecar_pins");
//
// Start() writes the YAML config (a socket in the given directory, a free
// loopback port for /metrics, the store, the window and arena sizes) and runs
// the binary under a DaemonProcess (TestDaemon). The binary is
// $GRANARY_SIDECAR_BINARY if set, else the GRANARY_SIDECAR_BINARY compile
// definition.
//
// Thread safety: as TestDaemon: the test's main thread starts and stops it;
// metrics may be read from any thread.

#include <cstdint>
#include <string>

#include "testing/cachenode_fixture.h"

namespace granary::testing {

std::string SidecarBinary();

struct SidecarOptions {
  std::string store_url;
  std::string pool = "default";
  std::string local_node_id;  // empty: none preferred
  std::string window_bytes = "64MiB";
  uint32_t window_samples = 512;
  std::string arena_bytes = "128MiB";
  uint32_t fetch_threads = 2;
  std::string log_level = "info";
  std::string extra_yaml;  // appended as is ("key: value\n" lines)
};

class SidecarProcess;

// The sidecar most suites start once their cluster is up (nodes started, a
// dataset made with CacheCluster::CreateDataset, which waits for Ready): for
// the cluster's store (unless `o` names another), with a small window (2 MiB
// in a 32 MiB arena, unless `o` sets them), in <cluster dir>/<name>; started
// and ready. The local node is `o`'s to choose (usually cluster.node(0).id()).
Result<std::unique_ptr<SidecarProcess>> StartClusterSidecar(CacheCluster& cluster,
                                                            SidecarOptions o = {},
                                                            const std::string& name = "sidecar");

class SidecarProcess : public TestDaemon {
 public:
  SidecarProcess(SidecarOptions options, std::string dir);
  ~SidecarProcess() override;

  const SidecarOptions& options() const { return options_; }
  SidecarOptions& mutable_options() { return options_; }  // applies at the next Start
  // <dir>/sidecar.sock
  const std::string& socket_path() const { return socket_path_; }
  pid_t pid() const;

  std::string ConfigYaml() override;

 private:
  SidecarOptions options_;
  std::string socket_path_;
};

}  // namespace granary::testing

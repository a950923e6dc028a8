// granary-cachenode: one per GPU host. Loads its YAML configuration, starts a
// CacheNode (cache_node.h) and runs until SIGTERM or SIGINT, then stops it
// cleanly: deregister, drain, stop staging. docs/cachenode.md, "The daemon".
//
// Exit status: 0 after a clean stop (or a good --check), 1 when start-up
// fails at run time (metadata store unreachable, data directory locked,
// address in use), 2 for a bad command line or configuration.

#include <malloc.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <string_view>

#include "granary/cachenode/cache_node.h"
#include "granary/config/cachenode_config.h"
#include "granary/core/metadata_store.h"  // ValidateNodeId
#include "granary/core/net_address.h"
#include "granary/daemon/daemon_main.h"
#include "granary/source/snapshot.h"

int main(int argc, char** argv) {
  // Replies are built in memory, up to the reply budget (reply_buffer_bytes),
  // as strings of one READ item each (up to 64 MiB). glibc serves a block of
  // at least M_MMAP_THRESHOLD with its own mmap and unmaps it when freed; by
  // default that threshold rises to the size of each such block freed (up to
  // 32 MiB), after which blocks of a few MiB come from the heap arenas and
  // stay in the process after a flood of requests has gone (measured: 267 MiB
  // of 280 kept). A fixed threshold turns that off: every block of 1 MiB or
  // more goes back to the OS when its reply is sent or dropped.
  (void)::mallopt(M_MMAP_THRESHOLD, 1 << 20);
  // The snapshot helper the node spawns to walk a source as its owner
  // (granary/source/snapshot.h): its request on stdin, its answer on stdout.
  if (argc == 2 && std::string_view(argv[1]) == granary::kSnapshotChildFlag) {
    return granary::RunSnapshotChild(STDIN_FILENO, STDOUT_FILENO);
  }
  CLI::App app{
      "granary-cachenode: stages datasets from their source onto this host's local disk and "
      "serves them to sidecars and peers.\n"
      "Exit status: 0 clean stop, 1 start-up failure (store unreachable, data_dir locked, "
      "address in use), 2 bad command line or configuration."};
  granary::DaemonMain daemon("granary-cachenode", app);
  daemon.AddConfigFile("docs/cachenode.md");
  // One configuration file serves every node of a pool (a Kubernetes
  // ConfigMap); what differs per node comes on the command line.
  std::string node_id;
  std::string advertise;
  app.add_option("--node-id", node_id,
                 "Overrides the configuration's node_id (e.g. the Kubernetes node name)");
  app.add_option("--advertise", advertise,
                 "Overrides the configuration's advertise address (host:port; e.g. the host IP)");
  if (std::optional<int> exit = daemon.Parse(argc, argv)) return *exit;

  granary::Result<granary::CacheNodeConfig> config =
      granary::LoadCacheNodeConfig(daemon.config_path());
  if (!config.ok()) return daemon.BadConfig(config.status());
  if (!node_id.empty()) {
    const granary::Status valid = granary::ValidateNodeId(node_id);
    if (!valid.ok()) return daemon.Usage("--node-id: " + valid.message());
    config->node_id = node_id;
  }
  if (!advertise.empty()) {
    granary::Result<granary::NetAddress> address = granary::ParseNetAddress(advertise);
    if (!address.ok() || address->port == 0 || address->host == "0.0.0.0" ||
        address->host == "::") {
      return daemon.Usage("--advertise " + advertise +
                          ": write the host:port others reach this node at (not a wildcard host, "
                          "not port 0)" +
                          (address.ok() ? "" : ": " + address.status().message()));
    }
    config->advertise = *address;
  }
  // Who may read: a node without authentication does not start unless told to.
  if (granary::Status auth = granary::CheckCacheNodeAuthentication(*config, daemon.config_path());
      !auth.ok()) {
    return daemon.BadConfig(auth);
  }
  if (daemon.check()) {
    std::printf("%s: OK (node %s, pool %s)\n", daemon.config_path().c_str(),
                config->node_id.c_str(), config->pool.c_str());
    return granary::kDaemonExitOk;
  }
  // CacheNode::Start sets the configuration's level too: make them agree.
  config->log_level = daemon.ApplyLogLevel(config->log_level);

  // Before the node starts a thread: its threads inherit the blocked stop
  // signals, and this thread waits for them below.
  daemon.PrepareSignals();

  granary::Result<std::unique_ptr<granary::CacheNode>> node = granary::CacheNode::Start(*config);
  if (!node.ok()) return daemon.StartFailed(node.status());
  daemon.WaitForStop("cachenode");
  (*node)->Stop();
  return granary::kDaemonExitOk;
}

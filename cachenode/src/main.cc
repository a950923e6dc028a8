// granary-cachenode: one per GPU host. Loads its YAML configuration, starts a
// CacheNode (cache_node.h) and runs until SIGTERM or SIGINT, then stops it
// cleanly: deregister, drain, stop staging. docs/cachenode.md, "The daemon".
//
// Exit status: 0 after a clean stop (or a good --check), 1 when start-up
// fails at run time (metadata store unreachable, data directory locked,
// address in use), 2 for a bad command line or configuration.

#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "granary/cachenode/cache_node.h"
#include "granary/cachenode/config.h"
#include "granary/core/log.h"
#include "granary/core/metadata_store.h"
#include "granary/core/net_address.h"
#include "granary/core/snapshot.h"
#include "granary/daemon/stop_signals.h"

namespace {

constexpr int kExitRuntime = 1;
constexpr int kExitUsage = 2;

}  // namespace

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
  // (granary/core/snapshot.h): its request on stdin, its answer on stdout.
  if (argc == 2 && std::string_view(argv[1]) == granary::kSnapshotChildFlag) {
    return granary::RunSnapshotChild(STDIN_FILENO, STDOUT_FILENO);
  }
  CLI::App app{
      "granary-cachenode: stages datasets from their source onto this host's local disk and "
      "serves them to sidecars and peers.\n"
      "Exit status: 0 clean stop, 1 start-up failure (store unreachable, data_dir locked, "
      "address in use), 2 bad command line or configuration."};
  std::string config_path;
  bool check = false;
  app.add_option("-c,--config", config_path, "The YAML configuration file (docs/cachenode.md)")
      ->required();
  app.add_flag("--check", check, "Check the configuration and exit");
  // One configuration file serves every node of a pool (a Kubernetes
  // ConfigMap); what differs per node comes on the command line.
  std::string node_id;
  std::string advertise;
  app.add_option("--node-id", node_id,
                 "Overrides the configuration's node_id (e.g. the Kubernetes node name)");
  app.add_option("--advertise", advertise,
                 "Overrides the configuration's advertise address (host:port; e.g. the host IP)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kExitUsage;
  }

  granary::Result<granary::CacheNodeConfig> config = granary::LoadCacheNodeConfig(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "granary-cachenode: %s\n", config.status().message().c_str());
    return kExitUsage;
  }
  if (!node_id.empty()) {
    const granary::Status valid = granary::ValidateNodeId(node_id);
    if (!valid.ok()) {
      std::fprintf(stderr, "granary-cachenode: --node-id: %s\n", valid.message().c_str());
      return kExitUsage;
    }
    config->node_id = node_id;
  }
  if (!advertise.empty()) {
    granary::Result<granary::NetAddress> address = granary::ParseNetAddress(advertise);
    if (!address.ok() || address->port == 0 || address->host == "0.0.0.0" ||
        address->host == "::") {
      std::fprintf(stderr,
                   "granary-cachenode: --advertise %s: write the host:port others reach this node "
                   "at (not a wildcard host, not port 0)%s%s\n",
                   advertise.c_str(), address.ok() ? "" : ": ",
                   address.ok() ? "" : address.status().message().c_str());
      return kExitUsage;
    }
    config->advertise = *address;
  }
  if (check) {
    std::printf("%s: OK (node %s, pool %s)\n", config_path.c_str(), config->node_id.c_str(),
                config->pool.c_str());
    return 0;
  }

  // Block the stop signals in every thread (the threads the node starts
  // inherit the mask); this thread waits for them below.
  const sigset_t stop_signals = granary::BlockStopSignals();

  granary::Result<std::unique_ptr<granary::CacheNode>> node = granary::CacheNode::Start(*config);
  if (!node.ok()) {
    std::fprintf(stderr, "granary-cachenode: %s\n", node.status().ToString().c_str());
    return kExitRuntime;
  }
  const std::string_view stopped_by = granary::WaitForStopSignal(stop_signals);
  granary::GetLogger("cachenode")->info("received {}: stopping", stopped_by);
  (*node)->Stop();
  return 0;
}

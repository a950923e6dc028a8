// granary-sidecar: one per training pod or job node. Loads its YAML
// configuration, starts a Sidecar (sidecar.h) and runs until SIGTERM or
// SIGINT, then stops it cleanly: closes every client connection (their shared
// memory pins go with them), stops prefetching, removes the socket.
// docs/sidecar.md.
//
// Exit status: 0 after a clean stop (or a good --check), 1 when start-up fails
// at run time (store unreachable, socket in use), 2 for a bad command line or
// configuration.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "granary/config/sidecar_config.h"
#include "granary/core/metadata_store.h"  // ValidateNodeId
#include "granary/daemon/daemon_main.h"
#include "granary/sidecar/sidecar.h"

int main(int argc, char** argv) {
  CLI::App app{
      "granary-sidecar: serves a host's training processes their datasets' samples over a Unix "
      "socket and shared memory, prefetching in the order of their plans.\n"
      "Exit status: 0 clean stop, 1 start-up failure (store unreachable, socket in use), 2 bad "
      "command line or configuration."};
  granary::DaemonMain daemon("granary-sidecar", app);
  daemon.AddConfigFile("docs/sidecar.md");
  // One configuration serves every pod of a pool (the webhook's annotation);
  // the node the pod runs on comes on the command line.
  std::string local_node;
  app.add_option("--local-node", local_node,
                 "Overrides the configuration's local_node (e.g. the Kubernetes node name)");
  if (std::optional<int> exit = daemon.Parse(argc, argv)) return *exit;

  granary::Result<granary::sidecar::SidecarConfig> config =
      granary::sidecar::LoadSidecarConfig(daemon.config_path());
  if (!config.ok()) return daemon.BadConfig(config.status());
  if (!local_node.empty()) {
    const granary::Status valid = granary::ValidateNodeId(local_node);
    if (!valid.ok()) return daemon.Usage("--local-node: " + valid.message());
    config->local_node = local_node;
  }
  if (daemon.check()) {
    std::printf("%s: OK (socket %s, pool %s, local node %s)\n", daemon.config_path().c_str(),
                config->socket_path.c_str(), config->pool.c_str(),
                config->local_node.empty() ? "none" : config->local_node.c_str());
    return granary::kDaemonExitOk;
  }
  config->log_level = daemon.ApplyLogLevel(config->log_level);

  daemon.PrepareSignals();  // before the sidecar starts a thread

  granary::Result<std::unique_ptr<granary::sidecar::Sidecar>> sidecar =
      granary::sidecar::Sidecar::Start(*config);
  if (!sidecar.ok()) return daemon.StartFailed(sidecar.status());
  daemon.WaitForStop("sidecar");
  (*sidecar)->Stop();
  return granary::kDaemonExitOk;
}

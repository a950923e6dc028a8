// granary-sidecar: one per training pod or job node. Loads its YAML
// configuration, starts a Sidecar (sidecar.h) and runs until SIGTERM or
// SIGINT, then stops it cleanly: closes every client connection (their shared
// memory pins go with them), stops prefetching, removes the socket.
// docs/sidecar.md.
//
// Exit status: 0 after a clean stop (or a good --check), 1 when start-up fails
// at run time (store unreachable, socket in use), 2 for a bad command line or
// configuration.

#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "granary/core/log.h"
#include "granary/core/metadata_store.h"
#include "granary/daemon/stop_signals.h"
#include "granary/sidecar/config.h"
#include "granary/sidecar/sidecar.h"

namespace {
constexpr int kExitRuntime = 1;
constexpr int kExitUsage = 2;
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "granary-sidecar: serves a host's training processes their datasets' samples over a Unix "
      "socket and shared memory, prefetching in the order of their plans.\n"
      "Exit status: 0 clean stop, 1 start-up failure (store unreachable, socket in use), 2 bad "
      "command line or configuration."};
  std::string config_path;
  bool check = false;
  app.add_option("-c,--config", config_path, "The YAML configuration file (docs/sidecar.md)")
      ->required();
  app.add_flag("--check", check, "Check the configuration and exit");
  // One configuration serves every pod of a pool (the webhook's annotation);
  // the node the pod runs on comes on the command line.
  std::string local_node;
  app.add_option("--local-node", local_node,
                 "Overrides the configuration's local_node (e.g. the Kubernetes node name)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kExitUsage;
  }

  granary::Result<granary::sidecar::SidecarConfig> config =
      granary::sidecar::LoadSidecarConfig(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "granary-sidecar: %s\n", config.status().message().c_str());
    return kExitUsage;
  }
  if (!local_node.empty()) {
    const granary::Status valid = granary::ValidateNodeId(local_node);
    if (!valid.ok()) {
      std::fprintf(stderr, "granary-sidecar: --local-node: %s\n", valid.message().c_str());
      return kExitUsage;
    }
    config->local_node = local_node;
  }
  if (check) {
    std::printf("%s: OK (socket %s, pool %s, local node %s)\n", config_path.c_str(),
                config->socket_path.c_str(), config->pool.c_str(),
                config->local_node.empty() ? "none" : config->local_node.c_str());
    return 0;
  }
  granary::SetLogLevel(config->log_level);

  const sigset_t stop_signals = granary::BlockStopSignals();
  signal(SIGPIPE, SIG_IGN);

  granary::Result<std::unique_ptr<granary::sidecar::Sidecar>> sidecar =
      granary::sidecar::Sidecar::Start(*config);
  if (!sidecar.ok()) {
    std::fprintf(stderr, "granary-sidecar: %s\n", sidecar.status().ToString().c_str());
    return kExitRuntime;
  }
  const std::string_view stopped_by = granary::WaitForStopSignal(stop_signals);
  granary::GetLogger("sidecar")->info("received {}: stopping", stopped_by);
  (*sidecar)->Stop();
  return 0;
}

#include "testing/sidecar_fixture.h"

#include <cstdlib>
#include <sstream>
#include <utility>

namespace granary::testing {

std::string SidecarBinary() {
  if (const char* env = std::getenv("GRANARY_SIDECAR_BINARY"); env != nullptr && *env != '\0') {
    return env;
  }
#ifdef GRANARY_SIDECAR_BINARY
  return GRANARY_SIDECAR_BINARY;
#else
  return "granary-sidecar";
#endif
}

SidecarProcess::SidecarProcess(SidecarOptions options, std::string dir)
    : TestDaemon("sidecar", SidecarBinary(), dir, "sidecar"),
      options_(std::move(options)),
      socket_path_(dir + "/sidecar.sock") {}

SidecarProcess::~SidecarProcess() = default;

pid_t SidecarProcess::pid() const { return process_ != nullptr ? process_->pid() : 0; }

std::string SidecarProcess::ConfigYaml() {
  if (metrics_port_ == 0) ChoosePorts();
  const SidecarOptions& o = options_;
  std::ostringstream y;
  y << "socket: " << socket_path_ << "\n"
    << "metadata_store: " << o.store_url << "\n"
    << "pool: " << o.pool << "\n";
  if (!o.local_node_id.empty()) y << "local_node: " << o.local_node_id << "\n";
  y << "window_bytes: " << o.window_bytes << "\n"
    << "window_samples: " << o.window_samples << "\n"
    << "arena_bytes: " << o.arena_bytes << "\n"
    << "fetch_threads: " << o.fetch_threads << "\n"
    << "metrics_listen: " << metrics_address() << "\n"
    << "refresh_interval: 200ms\n"
    << "connect_timeout: 1s\n"
    << "node_down_for: 1s\n"
    << "log_level: " << o.log_level << "\n"
    << o.extra_yaml;
  return y.str();
}

}  // namespace granary::testing

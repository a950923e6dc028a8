#include "testing/sidecar_fixture.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "testing/fuse_mounts.h"

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

namespace {

// The mount points of a `mounts: "name:/path,name2:/path2"` line in `yaml`.
std::vector<std::string> MountPoints(const std::string& yaml) {
  std::vector<std::string> points;
  std::istringstream lines(yaml);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("mounts:", 0) != 0) continue;
    std::string value = line.substr(7);
    std::erase_if(value, [](char c) { return c == '"' || c == '\'' || c == ' '; });
    std::istringstream entries(value);
    std::string entry;
    while (std::getline(entries, entry, ',')) {
      const size_t colon = entry.find(':');
      if (colon != std::string::npos) points.push_back(entry.substr(colon + 1));
    }
  }
  return points;
}

}  // namespace

SidecarProcess::~SidecarProcess() {
  // A sidecar with `mounts:` serves FUSE views. Killed, as TestDaemon's
  // teardown kills it, it leaves them mounted and dead ("Transport endpoint
  // is not connected"): kill it here and detach what is left, lazily.
  const std::vector<std::string> views = MountPoints(options_.extra_yaml);
  if (views.empty()) return;
  if (process_ != nullptr) (void)process_->Kill();
  for (const std::string& view : views) {
    if (Status detached = DetachMount(view); !detached.ok()) {
      ADD_FAILURE() << "the sidecar's view at " << view << ": " << detached.ToString();
    }
  }
}

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

Result<std::unique_ptr<SidecarProcess>> StartClusterSidecar(CacheCluster& cluster, SidecarOptions o,
                                                            const std::string& name) {
  const SidecarOptions defaults;
  if (o.store_url.empty()) o.store_url = cluster.store_url();
  if (o.arena_bytes == defaults.arena_bytes) o.arena_bytes = "32MiB";  // >= window + 16MiB
  if (o.window_bytes == defaults.window_bytes) o.window_bytes = "2MiB";
  const std::string dir = cluster.dir().Join(name);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::FromErrno(ec.value(), "creating " + dir);
  auto sidecar = std::make_unique<SidecarProcess>(std::move(o), dir);
  GRANARY_RETURN_IF_ERROR(sidecar->StartAndWaitReady());
  return sidecar;
}

}  // namespace granary::testing

#include "granary/config/sidecar_config.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#include "granary/config/config_keys.h"
#include "granary/core/config.h"
#include "granary/core/log.h"
#include "granary/core/metadata_store.h"
#include "granary/core/names.h"
#include "granary/protocol/unix_socket.h"

namespace granary::sidecar {
namespace {

constexpr uint64_t kMinArenaHeadroom = 16ull << 20;
constexpr uint64_t kDefaultArenaHeadroom = 64ull << 20;
constexpr uint64_t kMaxWindowBytes = 1ull << 40;

Status OptionalBytes(ConfigMap& m, std::string_view key, uint64_t lo, uint64_t hi, uint64_t* out) {
  ByteSize size{*out};
  GRANARY_RETURN_IF_ERROR(m.Optional(key, &size));
  if (size.bytes < lo || size.bytes > hi) {
    return Status::InvalidArgument(m.Where(key) + ": " + std::to_string(size.bytes) +
                                   " bytes is out of range; write " + std::to_string(lo) + " to " +
                                   std::to_string(hi) + " bytes, e.g. 256MiB");
  }
  *out = size.bytes;
  return Status::Ok();
}

// "dataset:/dir[,dataset:/dir...]".
Status ParseMounts(ConfigMap& m, const std::string& text, SidecarConfig* c) {
  const std::string where = m.Where("mounts");
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(pos, end - pos);
    pos = end + 1;
    const size_t colon = item.find(':');
    if (colon == std::string::npos) {
      return Status::InvalidArgument(where + ": " + Quoted(item) +
                                     " is not dataset:/dir; write e.g. imagenet:/mnt/imagenet");
    }
    SidecarConfig::Mount mount{item.substr(0, colon), item.substr(colon + 1)};
    if (!IsDnsLabel(mount.dataset)) {
      return Status::InvalidArgument(where + ": " + Quoted(mount.dataset) +
                                     " is not a dataset name (a DNS-1123 label)");
    }
    if (mount.dir.empty() || mount.dir.front() != '/' || HasControlCharacter(mount.dir)) {
      return Status::InvalidArgument(where + ": " + Quoted(mount.dir) +
                                     " is not an absolute directory path; write e.g. " +
                                     mount.dataset + ":/mnt/" + mount.dataset);
    }
    for (const SidecarConfig::Mount& other : c->mounts) {
      if (other.dir == mount.dir) {
        return Status::InvalidArgument(where + ": " + Quoted(mount.dir) +
                                       " is named twice; give each mount its own directory");
      }
    }
    c->mounts.push_back(std::move(mount));
  }
  return Status::Ok();
}

// "a,b,c" (empty: none); after `mounts`, which must be among them.
Status ParseDatasets(ConfigMap& m, const std::string& text, SidecarConfig* c) {
  const std::string where = m.Where("datasets");
  std::vector<std::string> names;
  size_t pos = 0;
  while (!text.empty() && pos <= text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    std::string name = text.substr(pos, end - pos);
    pos = end + 1;
    if (!IsDnsLabel(name)) {
      return Status::InvalidArgument(where + ": " + Quoted(name) +
                                     " is not a dataset name (a DNS-1123 label); write names "
                                     "separated by commas, e.g. \"imagenet,coco\"");
    }
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      names.push_back(std::move(name));
    }
  }
  for (const SidecarConfig::Mount& mount : c->mounts) {
    if (std::find(names.begin(), names.end(), mount.dataset) == names.end()) {
      return Status::InvalidArgument(where + ": `mounts` mounts dataset " + Quoted(mount.dataset) +
                                     ", which is not among them; add it or drop the mount");
    }
  }
  c->datasets = std::move(names);
  return Status::Ok();
}

Status ParseSocket(ConfigMap& m, SidecarConfig* c) {
  bool given = false;
  GRANARY_RETURN_IF_ERROR(OptionalString(m, "socket", &c->socket_path, &given));
  std::string origin = m.Where("socket");
  if (!given) {
    const char* env = std::getenv("GRANARY_SOCKET");
    if (env != nullptr && env[0] != '\0') {
      c->socket_path = env;
      origin = "$GRANARY_SOCKET";
    } else {
      c->socket_path = std::string(kDefaultSocketPath);
    }
  }
  GRANARY_RETURN_IF_ERROR(CheckSocketPath(origin, c->socket_path, "/run/granary/sidecar.sock"));

  std::string mode_text;
  GRANARY_RETURN_IF_ERROR(OptionalString(m, "socket_mode", &mode_text, &given));
  if (given) {
    char* end = nullptr;
    const unsigned long mode = std::strtoul(mode_text.c_str(), &end, 8);
    if (mode_text.empty() || *end != '\0' || mode > 0777) {
      return Status::InvalidArgument(m.Where("socket_mode") + ": " + Quoted(mode_text) +
                                     " is not an octal file mode; write e.g. \"0660\"");
    }
    if ((mode & 0007) != 0) {
      return Status::InvalidArgument(
          m.Where("socket_mode") + ": " + Quoted(mode_text) +
          " lets every user on the host connect and read any dataset this sidecar serves; "
          "write 0660 (owner and group) or 0600");
    }
    if ((mode & 0600) != 0600) {
      return Status::InvalidArgument(m.Where("socket_mode") + ": " + Quoted(mode_text) +
                                     " does not let the sidecar's own user connect; write 0660 "
                                     "or 0600");
    }
    c->socket_mode = static_cast<uint32_t>(mode);
  }
  return Status::Ok();
}

Status Parse(ConfigMap& m, SidecarConfig* c) {
  GRANARY_RETURN_IF_ERROR(ParseSocket(m, c));

  GRANARY_RETURN_IF_ERROR(ParseStoreKeys(m, &c->metadata_store, &c->metadata_store_file));

  GRANARY_RETURN_IF_ERROR(m.Optional("pool", &c->pool));
  if (!IsDnsLabel(c->pool)) {
    return Status::InvalidArgument(m.Where("pool") + ": " + Quoted(c->pool) +
                                   " is not a pool name; write a DNS-1123 label, e.g. default");
  }

  bool given = false;
  GRANARY_RETURN_IF_ERROR(OptionalString(m, "local_node", &c->local_node, &given));
  if (!given) {
    Result<std::string> host = HostName();
    if (host.ok() && ValidateNodeId(*host).ok()) c->local_node = *host;
  } else if (Status valid = ValidateNodeId(c->local_node); !valid.ok()) {
    return Status::InvalidArgument(m.Where("local_node") + ": " + valid.message() +
                                   "; write the node_id of the cache node on this host");
  }

  GRANARY_RETURN_IF_ERROR(OptionalString(m, "local_node_socket", &c->local_node_socket, &given));
  if (given) {
    GRANARY_RETURN_IF_ERROR(CheckSocketPath(m.Where("local_node_socket"), c->local_node_socket,
                                            "/run/granary/cachenode.sock"));
  }

  GRANARY_RETURN_IF_ERROR(
      OptionalFilePath(m, "cluster_key_file", &c->cluster_key_file, "/etc/granary/cluster.key"));
  GRANARY_RETURN_IF_ERROR(OptionalFilePath(m, "peer_token_file", &c->peer_token_file,
                                           "/var/run/secrets/granary/token"));
  GRANARY_RETURN_IF_ERROR(
      OptionalFilePath(m, "tls_ca_file", &c->tls_ca_file, "/etc/granary/tls/ca.crt"));
  if (!c->cluster_key_file.empty() && !c->peer_token_file.empty()) {
    return Status::InvalidArgument(m.Where("peer_token_file") +
                                   ": write one of 'cluster_key_file' and 'peer_token_file', "
                                   "not both");
  }

  GRANARY_RETURN_IF_ERROR(OptionalString(m, "transport", &c->transport, &given));
  if (c->transport != "tcp" && c->transport != "libfabric") {
    return Status::InvalidArgument(m.Where("transport") + ": " + Quoted(c->transport) +
                                   " is not a transport: write tcp or libfabric");
  }
  GRANARY_RETURN_IF_ERROR(OptionalString(m, "libfabric_provider", &c->libfabric_provider, &given));
  if (given && c->transport != "libfabric") {
    return Status::InvalidArgument(m.Where("libfabric_provider") +
                                   ": a provider without 'transport: libfabric': add that, or "
                                   "remove the provider");
  }
  if (c->libfabric_provider.empty() ||
      c->libfabric_provider.find_first_of(" \t,") != std::string::npos) {
    return Status::InvalidArgument(m.Where("libfabric_provider") + ": " +
                                   Quoted(c->libfabric_provider) +
                                   " is not a provider name: write tcp or verbs (fi_info lists "
                                   "the providers of this host)");
  }

  std::string mounts;
  GRANARY_RETURN_IF_ERROR(OptionalString(m, "mounts", &mounts, &given));
  if (given) GRANARY_RETURN_IF_ERROR(ParseMounts(m, mounts, c));

  std::string datasets;
  GRANARY_RETURN_IF_ERROR(OptionalString(m, "datasets", &datasets, &given));
  if (given) GRANARY_RETURN_IF_ERROR(ParseDatasets(m, datasets, c));

  GRANARY_RETURN_IF_ERROR(OptionalCount(m, "window_samples", 1, 1u << 24, &c->window_samples));
  GRANARY_RETURN_IF_ERROR(
      OptionalBytes(m, "window_bytes", 1ull << 20, kMaxWindowBytes, &c->window_bytes));
  c->arena_bytes = c->window_bytes + kDefaultArenaHeadroom;
  GRANARY_RETURN_IF_ERROR(OptionalBytes(m, "arena_bytes", c->window_bytes + kMinArenaHeadroom,
                                        kMaxWindowBytes * 2, &c->arena_bytes));
  GRANARY_RETURN_IF_ERROR(OptionalCount(m, "fetch_threads", 1, 64, &c->fetch_threads));
  GRANARY_RETURN_IF_ERROR(OptionalCount(m, "fetch_batch", 1, 4096, &c->fetch_batch));
  GRANARY_RETURN_IF_ERROR(m.Optional("source_fallthrough", &c->source_fallthrough));
  GRANARY_RETURN_IF_ERROR(OptionalCount(m, "source_concurrency", 1, 1024, &c->source_concurrency));
  GRANARY_RETURN_IF_ERROR(OptionalCount(m, "max_clients", 1, 65536, &c->max_clients));
  c->max_clients_per_uid = std::max<uint32_t>(1, c->max_clients / 4);
  GRANARY_RETURN_IF_ERROR(
      OptionalCount(m, "max_clients_per_uid", 1, c->max_clients, &c->max_clients_per_uid));
  GRANARY_RETURN_IF_ERROR(OptionalPositiveDuration(m, "idle_timeout", &c->idle_timeout));
  GRANARY_RETURN_IF_ERROR(
      OptionalAddress(m, "metrics_listen", "metrics listen address", &c->metrics_listen));
  GRANARY_RETURN_IF_ERROR(OptionalPositiveDuration(m, "refresh_interval", &c->refresh_interval));
  GRANARY_RETURN_IF_ERROR(OptionalPositiveDuration(m, "connect_timeout", &c->connect_timeout));
  GRANARY_RETURN_IF_ERROR(OptionalPositiveDuration(m, "call_timeout", &c->call_timeout));
  GRANARY_RETURN_IF_ERROR(OptionalPositiveDuration(m, "node_down_for", &c->node_down_for));
  GRANARY_RETURN_IF_ERROR(OptionalPositiveDuration(m, "wait_timeout", &c->wait_timeout));
  GRANARY_RETURN_IF_ERROR(OptionalPositiveDuration(m, "startup_timeout", &c->startup_timeout));

  GRANARY_RETURN_IF_ERROR(OptionalLogLevel(m, "log_level", &c->log_level));
  return m.Finish();
}

}  // namespace

Result<SidecarConfig> ParseSidecarConfig(std::string_view text, std::string source_name) {
  GRANARY_ASSIGN_OR_RETURN(ConfigMap m, ConfigMap::FromText(text, std::move(source_name)));
  SidecarConfig config;
  GRANARY_RETURN_IF_ERROR(Parse(m, &config));
  return config;
}

Result<SidecarConfig> LoadSidecarConfig(const std::string& path) {
  GRANARY_ASSIGN_OR_RETURN(std::string text, ReadConfigFile(path, "sidecar"));
  GRANARY_ASSIGN_OR_RETURN(SidecarConfig config, ParseSidecarConfig(text, path));
  if (!config.metadata_store_file.empty()) {
    GRANARY_ASSIGN_OR_RETURN(config.metadata_store,
                             ReadStoreUrlFile(path, config.metadata_store_file));
  }
  return config;
}

}  // namespace granary::sidecar

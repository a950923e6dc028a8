#pragma once

// granary-sidecar's configuration: the YAML file named by
// `granary-sidecar --config FILE`, read into a SidecarConfig whose every field
// is checked before the daemon starts. docs/sidecar.md, "Configuration", lists
// every key; examples/sidecar.yaml is a complete file.
//
// Every bad value is kInvalidArgument naming the file, the line, the key, the
// bad value and what to write; unknown keys are rejected with the nearest
// known key as a suggestion (ConfigMap).
//
// Who calls it: the sidecar's main (LoadSidecarConfig once at start-up), tests.
//
// Thread safety: plain values and pure functions (the defaults read the
// environment and the host name).

#include <spdlog/common.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "granary/core/net_address.h"
#include "granary/core/status.h"

namespace granary::sidecar {

inline constexpr std::string_view kDefaultSocketPath = "/run/granary/sidecar.sock";
inline constexpr uint16_t kDefaultSidecarMetricsPort = 9465;

struct SidecarConfig {
  // `socket`: the Unix socket clients connect to. Default: $GRANARY_SOCKET if
  // set, else /run/granary/sidecar.sock. At most 107 bytes, absolute.
  std::string socket_path;
  // `socket_mode`: permissions of the socket file, octal ("0660"); no
  // permission for others is allowed (world-connectable sockets are refused).
  uint32_t socket_mode = 0660;
  // `metadata_store`: the store URL (redis://... or sqlite:///...).
  std::string metadata_store;
  // `metadata_store_file`: instead of metadata_store, an absolute path of a
  // file holding the URL (a mounted Kubernetes Secret). LoadSidecarConfig
  // reads it into metadata_store; ParseSidecarConfig only checks the path.
  std::string metadata_store_file;
  // `pool`: the cache pool whose datasets this sidecar serves.
  std::string pool = "default";
  // `local_node`: the id of the cache node on this host, preferred when it
  // owns a chunk. Default: the host name (what a cache node defaults to).
  std::string local_node;
  // `local_node_socket`: the `local_socket` of that cache node (its chunk
  // handoff socket). When set, samples the local node has on disk are read
  // straight from its chunk files (descriptors handed over the socket) into
  // the arena, instead of over TCP. Empty: off.
  std::string local_node_socket;
  // `mounts`: datasets to mount at start-up as read-only file systems (the
  // POSIX view, docs/posix-view.md), served in process from this sidecar's
  // shared memory: "dataset:/dir[,dataset:/dir...]". Each directory must exist
  // and be empty; the views unmount when the sidecar stops.
  struct Mount {
    std::string dataset;
    std::string dir;
  };
  std::vector<Mount> mounts;
  // `datasets`: the only datasets of the pool this sidecar opens, "a,b,c";
  // every other is refused (a Slurm job's sidecar, whose socket is the job
  // user's: the datasets its #DW lines name and that user may read). Empty
  // text: none. Unset: every dataset of the pool. `mounts` must be among them.
  std::optional<std::vector<std::string>> datasets;
  // `window_samples` and `window_bytes`: how far prefetch runs ahead of each
  // plan's readers (whichever limit is reached first).
  uint32_t window_samples = 1024;
  uint64_t window_bytes = 256ull << 20;
  // `arena_bytes`: the shared memory per open dataset that holds prefetched,
  // fetched and pinned samples. At least window_bytes + 16 MiB. Default
  // window_bytes + 64 MiB.
  uint64_t arena_bytes = 0;
  // `fetch_threads`: prefetch workers; `fetch_batch`: samples per fetch call.
  uint32_t fetch_threads = 4;
  uint32_t fetch_batch = 64;
  // `source_fallthrough`: read from the source when no cache node can serve.
  bool source_fallthrough = true;
  // `source_concurrency`: source reads in flight per dataset (fall-through).
  uint32_t source_concurrency = 8;
  // `max_clients`: connections served at once (one thread each).
  uint32_t max_clients = 256;
  // `max_clients_per_uid`: connections one uid other than root and the
  // sidecar's own may hold; default max_clients / 4 (at least 1). The last
  // max_clients / 8 places are kept for root and the sidecar's uid
  // (ConnectionLimits, docs/sidecar.md "Idle and greedy clients").
  uint32_t max_clients_per_uid = 0;
  // `idle_timeout`: a connection with no request and no reply in progress
  // for this long is closed (its pins dropped). A request being served (a
  // GET waiting for samples) is never idle.
  std::chrono::milliseconds idle_timeout{30 * 60 * 1000};
  // `metrics_listen`: /metrics, /healthz, /readyz.
  NetAddress metrics_listen{"127.0.0.1", kDefaultSidecarMetricsPort};
  // `refresh_interval`: how often the node list is re-read from the store.
  std::chrono::milliseconds refresh_interval{1000};
  // `cluster_key_file`: the cluster key the sidecar proves to cache nodes
  // that require authentication (peer_auth.h; on Slurm nodes, run as root).
  // Not set (and no peer_token_file): kDefaultClusterKeyPath when the
  // sidecar's user may read it, else none.
  std::string cluster_key_file;
  // `peer_token_file`: instead, a Kubernetes projected ServiceAccount token
  // (audience granary), read again at every connection; the injected sidecar
  // has it at /var/run/secrets/granary/token.
  std::string peer_token_file;
  // `tls_ca_file`: the CA that cache nodes serving TLS must chain to (and
  // name the address they are reached at); empty: TLS nodes are spoken to
  // encrypted but unverified (the cluster key's proofs are bound to the
  // channel; a token is then exposed to whoever sits in the middle).
  std::string tls_ca_file;
  // `transport`: how cache nodes are reached: "tcp" (default) or "libfabric"
  // (nodes that serve it, docs/transport.md; the others over TCP).
  // `libfabric_provider`: its provider, "tcp" (default) or "verbs"
  // (InfiniBand, RoCE); only with transport libfabric.
  std::string transport = "tcp";
  std::string libfabric_provider = "tcp";
  // `connect_timeout`, `call_timeout`: to cache nodes (PeerClientOptions).
  std::chrono::milliseconds connect_timeout{2000};
  std::chrono::milliseconds call_timeout{30000};
  // `node_down_for`: how long a node that failed is skipped.
  std::chrono::milliseconds node_down_for{3000};
  // `wait_timeout`: how long a client request may wait for its samples.
  std::chrono::milliseconds wait_timeout{120000};
  // `startup_timeout`: how long start-up retries the metadata store.
  std::chrono::milliseconds startup_timeout{30000};
  spdlog::level::level_enum log_level = spdlog::level::info;
};

Result<SidecarConfig> ParseSidecarConfig(std::string_view text, std::string source_name);
Result<SidecarConfig> LoadSidecarConfig(const std::string& path);

}  // namespace granary::sidecar

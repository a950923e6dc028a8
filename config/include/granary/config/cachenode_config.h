#pragma once

// The cache node daemon's configuration: the YAML file named by
// `granary-cachenode --config FILE`, read into a CacheNodeConfig whose every
// field is checked (type, range, form, and the rules between fields) before the
// daemon does anything. Nothing is opened, bound or created here: the store
// URL, the data directory and the addresses are checked for their form only,
// and the parts that use them report what goes wrong at run time.
//
// Who calls it: the daemon's main (LoadCacheNodeConfig once at start-up, then
// the fields go into ChunkStoreOptions, StagerOptions, ServerOptions,
// OpenMetadataStore and the heartbeat loop). docs/cachenode.md,
// "Configuration", lists every key; examples/cachenode.yaml is a complete file.
//
// Every bad value is kInvalidArgument naming the file, the line, the key, the
// bad value and what to write (ConfigMap, core/config.h), e.g.
//   "/etc/granary/cachenode.yaml:4: key 'worker_threads': 0 is out of range; write 1 to 64"
//   "cachenode.yaml:9: key 'heartbeat_ttl': 3s must exceed twice 'heartbeat_interval' (2s, line 8);
//   ..."
// Unknown keys are rejected with the nearest known key as a suggestion.
//
// Thread safety: plain values and pure functions (LoadCacheNodeConfig reads
// one file; the host-name default calls gethostname).

#include <spdlog/common.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "granary/core/chunk_file.h"
#include "granary/core/net_address.h"
#include "granary/core/status.h"

namespace granary {

// Connections the chunk-handoff socket holds at once (HandoffServerOptions);
// local_socket_max_per_uid may not exceed it.
inline constexpr uint32_t kDefaultHandoffMaxConnections = 64;

// Ranges of the counts (inclusive).
inline constexpr uint32_t kMaxCacheNodeSourceConcurrency = 1024;  // = kMaxStagerThreads
inline constexpr uint32_t kMaxCacheNodeWorkerThreads = 64;
inline constexpr uint32_t kMaxCacheNodeServiceThreads = 256;
inline constexpr uint32_t kMaxCacheNodeScanThreads = 64;  // = ChunkStore::kMaxScanThreads
inline constexpr uint32_t kMaxCacheNodeConnections = 65536;

// The range of `reply_buffer_bytes`: at least one READ of the largest size the
// protocol allows (kDefaultMaxReadBytes), so every READ fits the budget alone.
inline constexpr uint64_t kMinCacheNodeReplyBufferBytes = 64ull << 20;
inline constexpr uint64_t kMaxCacheNodeReplyBufferBytes = 1ull << 40;
// The least `connection_reply_buffer_bytes`.
inline constexpr uint64_t kMinCacheNodeConnectionReplyBufferBytes = 1ull << 20;

// The default ports: the protocol's and the metrics endpoint's (9464 is the
// port OpenTelemetry's Prometheus exporter uses).
inline constexpr uint16_t kDefaultCacheNodePort = 7070;
inline constexpr uint16_t kDefaultMetricsPort = 9464;

struct CacheNodeConfig {
  // `node_id`: the node's name in the store (ValidateNodeId: 1..253 of
  // [A-Za-z0-9._-], starting with an alphanumeric). Default: the host name.
  std::string node_id;
  // `pool`: the pool whose datasets this node stages, a DNS-1123 label.
  std::string pool = "default";
  // `listen`: where the protocol is served (sidecars and peers). Default
  // 0.0.0.0:7070: every interface, because readers are on other hosts. Port 0
  // picks a free port (tests).
  NetAddress listen{"0.0.0.0", kDefaultCacheNodePort};
  // `advertise`: host:port that peers and sidecars are told (NodeRecord::
  // address). Default: listen's host, or the host name if listen's host is a
  // wildcard (0.0.0.0, ::), with listen's port. A port of 0 here (only when
  // listen's port is 0 and advertise is not given) means "the port the server
  // bound": the daemon fills it in after Server::Start.
  NetAddress advertise;
  // `data_dir`: the chunk store's root (ChunkStore::Open), an absolute path.
  std::string data_dir;
  // `capacity`: bytes the chunk store may use, > 0 ("800GiB").
  uint64_t capacity_bytes = 0;
  // `metadata_store`: the store URL (OpenMetadataStore), redis://host... or
  // sqlite:///absolute/path. Only the form of its start is checked here.
  std::string metadata_store;
  // `metadata_store_file`: instead of metadata_store, an absolute path of a
  // file holding the URL (a mounted Secret). LoadCacheNodeConfig reads it
  // into metadata_store; ParseCacheNodeConfig only checks the path.
  std::string metadata_store_file;
  // `source_concurrency`: source reads in flight (StagerOptions::threads).
  uint32_t source_concurrency = 16;
  // `worker_threads`: event loops serving the protocol (ServerOptions::io_threads).
  uint32_t worker_threads = 2;
  // `service_threads`: threads reading chunks for requests (ServerOptions::service_threads).
  uint32_t service_threads = 4;
  // `max_connections`: protocol connections open at once (ServerOptions::max_connections).
  uint32_t max_connections = 1024;
  // `max_connections_per_address`: connections one remote address may hold
  // (ServerOptions::max_connections_per_address; 0: its default).
  uint32_t max_connections_per_address = 0;
  // `max_unauthenticated_per_address`: of those, not yet authenticated.
  uint32_t max_unauthenticated_per_address = 16;
  // `reply_buffer_bytes`: bytes of READ replies all protocol connections
  // together may hold in memory (ServerOptions::reply_buffer_bytes);
  // kMinCacheNodeReplyBufferBytes..kMaxCacheNodeReplyBufferBytes.
  uint64_t reply_buffer_bytes = 256ull << 20;
  // `connection_reply_buffer_bytes`: what one connection may hold of it
  // before it stops reading requests (ServerOptions::
  // connection_reply_buffer_bytes); kMinCacheNodeConnectionReplyBufferBytes..
  // reply_buffer_bytes. 0 (not written): a quarter of reply_buffer_bytes.
  uint64_t connection_reply_buffer_bytes = 0;
  // `write_timeout`: a connection whose reply takes no byte for this long (a
  // client that stopped reading) is closed (ServerOptions::write_timeout); > 0.
  std::chrono::milliseconds write_timeout{30000};
  // `reply_stall_timeout`: while a READ waits for the reply budget, a
  // connection holding some of it whose client took no reply byte for this
  // long is closed (ServerOptions::reply_stall_timeout); > 0.
  std::chrono::milliseconds reply_stall_timeout{5000};
  // `metrics_listen`: /metrics, /healthz and /readyz. Default 127.0.0.1:9464:
  // the endpoint has no authentication, so exposing it is the admin's choice.
  NetAddress metrics_listen{"127.0.0.1", kDefaultMetricsPort};
  // `cluster_key_file`: the cluster key (peer_auth.h; a file only root reads).
  // Set, or with `kubernetes_auth`: every connection to `listen` must
  // authenticate before it reads anything (protocol version 2). Neither: the
  // node refuses to start (CheckCacheNodeAuthentication) unless
  // `serve_without_authentication` says otherwise.
  std::string cluster_key_file;
  // `kubernetes_auth`: accept pods' projected ServiceAccount tokens, checked
  // with the API server (TokenReview): "in-cluster" (the pod's own
  // ServiceAccount) or the absolute path of a kubeconfig. Empty: off.
  std::string kubernetes_auth;
  // `kubernetes_audience`: the audience those tokens must carry.
  std::string kubernetes_audience = "granary";
  // `serve_without_authentication`: true lets a node with neither of the two
  // above start, serving whoever reaches its ports: only on loopback
  // (`listen` and `fabric_listen` on 127.0.0.0/8, ::1 or localhost), unless
  // `unsafe_serve_without_authentication_beyond_loopback` is true as well.
  bool serve_without_authentication = false;
  bool unsafe_serve_without_authentication_beyond_loopback = false;
  // `tls_cert_file`, `tls_key_file` (both or neither): `listen` speaks TLS
  // (the node's certificate chain and key, PEM); readers see it in the
  // node's record. Costs CPU: no sendfile through TLS.
  std::string tls_cert_file;
  std::string tls_key_file;
  // `fabric_listen`: host:port where the protocol is also served over
  // libfabric (docs/transport.md, "libfabric"); not set (the default): off.
  // Port 0 picks a free port. Not with tls_cert_file: the fabric carries the
  // authentication handshake but no encryption. The node's record then
  // carries the label `fabric` (kNodeLabelFabric) with the advertised host
  // and the fabric port, unless the provider or the listener fails at start:
  // then the node warns and serves TCP only (the fall-back).
  std::optional<NetAddress> fabric_listen;
  // `fabric_provider`: the libfabric provider: tcp (the default; any
  // Ethernet), verbs (InfiniBand, RoCE), or another `fi_info` lists.
  std::string fabric_provider = "tcp";
  // `verify_reads`: "always" (the default): every stored segment served is
  // read into memory and checked against its stored checksum here first;
  // "once": checked the first time, then sent from its file with sendfile
  // (no copy through this process, no hash) while the dataset is served.
  // Readers check every item against the stored checksum either way
  // (docs/cachenode.md, "Checksums").
  bool verify_reads_once = false;
  // `local_socket`: a Unix socket through which sidecars on this host get
  // read-only descriptors of chunk files (chunk handoff, chunk_handoff.h), an
  // absolute path. Empty (the default): off.
  std::string local_socket;
  // `local_socket_idle_timeout`: a handoff connection with no request or reply
  // in progress for this long is closed (HandoffServerOptions::idle_timeout).
  std::chrono::milliseconds local_socket_idle_timeout{60000};
  // `local_socket_max_per_uid`: handoff connections one uid other than root,
  // the node's own and the owners of the datasets it serves may hold, of the
  // socket's 64 places (a quarter of them by default).
  uint32_t local_socket_max_per_uid = 16;
  // `heartbeat_interval` and `heartbeat_ttl`: how often the node heartbeats,
  // and how long the store keeps it alive without one. The TTL must exceed
  // twice the interval (one lost heartbeat must not expire the node) and lie
  // within kMinNodeTtl..kMaxNodeTtl (metadata_store.h).
  std::chrono::milliseconds heartbeat_interval{2000};
  std::chrono::milliseconds heartbeat_ttl{10000};
  // `drain_timeout`: on SIGTERM, how long in-flight requests may finish
  // (ServerOptions::drain_timeout); > 0.
  std::chrono::milliseconds drain_timeout{5000};
  // `progress_refresh_interval`: how often a dataset's staging progress is
  // put again though it did not change, so a record the store lost (a Redis
  // failover before it replicated) comes back; > 0.
  std::chrono::milliseconds progress_refresh_interval{60000};
  // `cache_idle_after`: a dataset with no read and no plan registered for
  // this long is idle: when the node is full, idle datasets give up their
  // chunks before datasets in use (docs/cachenode.md, "When the cache is
  // full"); > 0.
  std::chrono::milliseconds cache_idle_after{600000};
  // `cache_policy`: "resident" (false: a dataset larger than its budget keeps
  // the chunks its plans read first and streams the rest) or "lru" (true:
  // what is read is kept and the least recently used chunk is evicted; the
  // baseline other caches use, for benchmarks).
  bool cache_lru = false;
  // `startup_timeout`: how long start-up keeps trying to reach the metadata
  // store before the daemon gives up (exit status 1); > 0.
  std::chrono::milliseconds startup_timeout{30000};
  // `log_level`: trace, debug, info, warn, error, off (ParseLogLevel).
  spdlog::level::level_enum log_level = spdlog::level::info;
  // `scan_mode`: how the start-up scan checks chunk files: "presence" (trust
  // the bitmap; seconds) or "verify" (read and checksum every segment; minutes
  // per terabyte). ChunkStoreOptions::scan_mode.
  ChunkScanMode scan_mode = ChunkScanMode::kPresence;
  // `scan_threads`: threads of the start-up scan (ChunkStoreOptions::scan_threads).
  uint32_t scan_threads = 4;
};

// Parses a whole configuration document. `source_name` (the file path, or
// e.g. "<test>") starts every error message.
Result<CacheNodeConfig> ParseCacheNodeConfig(std::string_view text, std::string source_name);

// Reads and parses the file at `path`. A missing or unreadable file, or a
// directory, is an error naming the path.
Result<CacheNodeConfig> LoadCacheNodeConfig(const std::string& path);

// Whether a node with configuration `c` (from `source`, the file) may start as
// far as its readers' authentication goes: OK with a cluster key or Kubernetes
// authentication; without either, kFailedPrecondition saying how to make a key
// or set up the Kubernetes auth, unless `serve_without_authentication` is
// true and every address it serves on is loopback (or the unsafe option says
// beyond loopback too). granary-cachenode (also with --check) and `granary
// doctor` apply it; CacheNode::Start again.
Status CheckCacheNodeAuthentication(const CacheNodeConfig& c, const std::string& source);
// Whether `host` (of a listen address) is a loopback address: 127.0.0.0/8,
// ::1, localhost.
bool IsLoopbackHost(const std::string& host);

// "presence" / "verify": the YAML names of ChunkScanMode.
std::string_view ChunkScanModeName(ChunkScanMode mode);

// Why a cache node running as `uid` must not use directory `path` (an
// existing directory; stat follows a symlink) as its data_dir: owned by
// another user, or writable by group or others, so that someone else could
// put a symlink where the node creates a file (its LOCK, a chunk file) and
// make it overwrite whatever that points to. Empty when it is fine. Used by
// ChunkStore::Open (which refuses) and `granary doctor`.
std::string DataDirOwnershipProblem(const std::string& path, uid_t uid);

}  // namespace granary

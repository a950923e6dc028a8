#include "granary/config/cachenode_config.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <utility>
#include <vector>

#include "granary/config/config_keys.h"
#include "granary/core/config.h"
#include "granary/core/file.h"
#include "granary/core/log.h"
#include "granary/core/metadata_store.h"
#include "granary/core/names.h"

namespace granary {
namespace {

std::string ByteText(uint64_t bytes) {
  if (bytes >= (1ull << 30) && bytes % (1ull << 30) == 0) {
    return std::to_string(bytes >> 30) + "GiB";
  }
  if (bytes >= (1ull << 20) && bytes % (1ull << 20) == 0) {
    return std::to_string(bytes >> 20) + "MiB";
  }
  return std::to_string(bytes) + " bytes";
}

// reply_buffer_bytes and connection_reply_buffer_bytes (the server's reply
// budget and one connection's share of it).
Status ParseReplyBuffers(ConfigMap& m, CacheNodeConfig* c) {
  ByteSize total{c->reply_buffer_bytes};
  GRANARY_RETURN_IF_ERROR(m.Optional("reply_buffer_bytes", &total));
  if (total.bytes < kMinCacheNodeReplyBufferBytes || total.bytes > kMaxCacheNodeReplyBufferBytes) {
    return Status::InvalidArgument(
        m.Where("reply_buffer_bytes") + ": " + ByteText(total.bytes) + " is out of range; write " +
        ByteText(kMinCacheNodeReplyBufferBytes) + " (one READ of the largest size) to " +
        ByteText(kMaxCacheNodeReplyBufferBytes) + ", e.g. 256MiB");
  }
  c->reply_buffer_bytes = total.bytes;
  // Not written, or written without a value: 0, the server's default (a quarter).
  constexpr uint64_t kNotGiven = ~0ull;
  ByteSize share{kNotGiven};
  GRANARY_RETURN_IF_ERROR(m.Optional("connection_reply_buffer_bytes", &share));
  if (share.bytes == kNotGiven) return Status::Ok();
  if (share.bytes < kMinCacheNodeConnectionReplyBufferBytes || share.bytes > total.bytes) {
    const bool total_given = m.Has("reply_buffer_bytes");
    return Status::InvalidArgument(m.Where("connection_reply_buffer_bytes") + ": " +
                                   ByteText(share.bytes) + " is out of range; write " +
                                   ByteText(kMinCacheNodeConnectionReplyBufferBytes) +
                                   " to 'reply_buffer_bytes' (" + ByteText(total.bytes) +
                                   (total_given ? std::string() : ", the default") +
                                   "), or leave it out for a quarter of 'reply_buffer_bytes'");
  }
  c->connection_reply_buffer_bytes = share.bytes;
  return Status::Ok();
}

// fabric_listen and fabric_provider (after listen and the TLS keys, which
// they are checked against).
Status ParseFabric(ConfigMap& m, CacheNodeConfig* c) {
  GRANARY_RETURN_IF_ERROR(m.Optional("fabric_provider", &c->fabric_provider));
  const std::string& provider = c->fabric_provider;
  if (provider.empty() || provider.size() > 64 ||
      !std::all_of(provider.begin(), provider.end(), [](char ch) {
        return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-' ||
               ch == ';';
      })) {
    return Status::InvalidArgument(m.Where("fabric_provider") + ": " + Quoted(provider) +
                                   " is not a libfabric provider name; write tcp, or verbs on "
                                   "InfiniBand or RoCE (`fi_info -l` lists this host's)");
  }
  std::string text;
  bool given = false;
  GRANARY_RETURN_IF_ERROR(OptionalString(m, "fabric_listen", &text, &given));
  if (!given || text.empty()) return Status::Ok();
  NetAddress address;
  GRANARY_RETURN_IF_ERROR(OptionalAddress(m, "fabric_listen", "fabric listen address", &address));
  if (!c->tls_cert_file.empty()) {
    return Status::InvalidArgument(
        m.Where("fabric_listen") +
        ": the fabric carries the authentication handshake but no encryption, and "
        "'tls_cert_file' asks for encrypted connections; leave 'fabric_listen' out to serve "
        "TLS, or leave out the TLS keys to serve the fabric (inside a trusted network)");
  }
  if (address.port != 0 && address.port == c->listen.port &&
      (address.host == c->listen.host || IsWildcardHost(address.host) ||
       IsWildcardHost(c->listen.host))) {
    return Status::InvalidArgument(m.Where("fabric_listen") + ": " + Quoted(address.ToString()) +
                                   " uses the port of 'listen' (" + Quoted(c->listen.ToString()) +
                                   "); give the fabric a port of its own, e.g. 7071");
  }
  c->fabric_listen = address;
  return Status::Ok();
}

Status Parse(ConfigMap& m, CacheNodeConfig* c) {
  // node_id: default the host name, which must then be a valid node id too.
  bool node_id_given = false;
  GRANARY_RETURN_IF_ERROR(OptionalString(m, "node_id", &c->node_id, &node_id_given));
  if (node_id_given) {
    Status valid = ValidateNodeId(c->node_id);
    if (!valid.ok()) {
      return Status::InvalidArgument(m.Where("node_id") + ": " + valid.message() +
                                     "; write e.g. gpu-7 or node-3.cluster");
    }
  } else {
    Result<std::string> host = HostName();
    if (!host.ok()) return host.status().WithContext(m.Where("node_id") + " (not set)");
    Status valid = ValidateNodeId(*host);
    if (!valid.ok()) {
      return Status::InvalidArgument(m.Where("node_id") + ": not set, and the host name " +
                                     Quoted(*host) + " is not a node id (" + valid.message() +
                                     "); set node_id, e.g. node_id: gpu-7");
    }
    c->node_id = *host;
  }

  GRANARY_RETURN_IF_ERROR(m.Optional("pool", &c->pool));
  if (!IsDnsLabel(c->pool)) {
    return Status::InvalidArgument(
        m.Where("pool") + ": " + Quoted(c->pool) +
        " is not a pool name; write a DNS-1123 label: 1..63 of lowercase a-z, 0-9 and '-', "
        "starting and ending with a letter or digit, e.g. default or a100-east");
  }

  GRANARY_RETURN_IF_ERROR(OptionalAddress(m, "listen", "listen address", &c->listen));
  GRANARY_RETURN_IF_ERROR(
      OptionalAddress(m, "metrics_listen", "metrics listen address", &c->metrics_listen));
  std::string advertise_text;
  bool advertise_given = false;
  GRANARY_RETURN_IF_ERROR(OptionalString(m, "advertise", &advertise_text, &advertise_given));
  if (advertise_given) {
    GRANARY_RETURN_IF_ERROR(OptionalAddress(m, "advertise", "advertised address", &c->advertise));
    if (c->advertise.port == 0 || IsWildcardHost(c->advertise.host)) {
      return Status::InvalidArgument(
          m.Where("advertise") + ": " + Quoted(c->advertise.ToString()) +
          " is not an address others can connect to (port 0 or a wildcard host); write the "
          "host name or IP and port peers reach this node at, e.g. gpu-7.cluster:7070");
    }
  } else {
    c->advertise = c->listen;
    if (IsWildcardHost(c->listen.host)) {
      Result<std::string> host = HostName();
      if (!host.ok()) return host.status().WithContext(m.Where("advertise") + " (not set)");
      c->advertise.host = *host;
    }
  }
  if (c->listen.port != 0 && c->listen.port == c->metrics_listen.port &&
      (c->listen.host == c->metrics_listen.host || IsWildcardHost(c->listen.host) ||
       IsWildcardHost(c->metrics_listen.host))) {
    // Blame the key that is written in the file (metrics_listen if both are).
    const bool metrics_given = m.Has("metrics_listen");
    return Status::InvalidArgument(
        m.Where(metrics_given ? "metrics_listen" : "listen") + ": 'listen' (" +
        Quoted(c->listen.ToString()) + ") and 'metrics_listen' (" +
        Quoted(c->metrics_listen.ToString()) + (metrics_given ? "" : ", the default") +
        ") use the same port; give one of them another port");
  }

  std::string verify_reads = "always";
  GRANARY_RETURN_IF_ERROR(m.Optional("verify_reads", &verify_reads));
  if (verify_reads != "always" && verify_reads != "once") {
    return Status::InvalidArgument(
        m.Where("verify_reads") + ": " + Quoted(verify_reads) +
        " is not a choice: write always (check every served segment here) or once (check it "
        "the first time, then send it with sendfile; readers check every item either way)");
  }
  c->verify_reads_once = verify_reads == "once";

  GRANARY_RETURN_IF_ERROR(
      OptionalFilePath(m, "cluster_key_file", &c->cluster_key_file, "/etc/granary/cluster.key"));
  bool kubernetes_given = false;
  GRANARY_RETURN_IF_ERROR(
      OptionalString(m, "kubernetes_auth", &c->kubernetes_auth, &kubernetes_given));
  if (kubernetes_given && c->kubernetes_auth != "in-cluster" &&
      (c->kubernetes_auth.empty() || c->kubernetes_auth.front() != '/' ||
       HasControlCharacter(c->kubernetes_auth))) {
    return Status::InvalidArgument(m.Where("kubernetes_auth") + ": " + Quoted(c->kubernetes_auth) +
                                   " is neither in-cluster nor an absolute kubeconfig path; write "
                                   "in-cluster in a pod, or e.g. /etc/granary/kubeconfig");
  }
  GRANARY_RETURN_IF_ERROR(m.Optional("kubernetes_audience", &c->kubernetes_audience));
  if (c->kubernetes_audience.empty() || HasControlCharacter(c->kubernetes_audience) ||
      c->kubernetes_audience.find(' ') != std::string::npos) {
    return Status::InvalidArgument(m.Where("kubernetes_audience") + ": " +
                                   Quoted(c->kubernetes_audience) +
                                   " is not an audience; write one word, e.g. granary");
  }

  GRANARY_RETURN_IF_ERROR(
      m.Optional("serve_without_authentication", &c->serve_without_authentication));
  GRANARY_RETURN_IF_ERROR(m.Optional("unsafe_serve_without_authentication_beyond_loopback",
                                     &c->unsafe_serve_without_authentication_beyond_loopback));

  GRANARY_RETURN_IF_ERROR(
      OptionalFilePath(m, "tls_cert_file", &c->tls_cert_file, "/etc/granary/tls/node.crt"));
  GRANARY_RETURN_IF_ERROR(
      OptionalFilePath(m, "tls_key_file", &c->tls_key_file, "/etc/granary/tls/node.key"));
  if (c->tls_cert_file.empty() != c->tls_key_file.empty()) {
    return Status::InvalidArgument(
        m.Where(c->tls_cert_file.empty() ? "tls_key_file" : "tls_cert_file") +
        ": write both 'tls_cert_file' and 'tls_key_file', or neither");
  }

  GRANARY_RETURN_IF_ERROR(ParseFabric(m, c));

  bool local_socket_given = false;
  GRANARY_RETURN_IF_ERROR(OptionalString(m, "local_socket", &c->local_socket, &local_socket_given));
  if (local_socket_given) {
    GRANARY_RETURN_IF_ERROR(
        CheckSocketPath(m.Where("local_socket"), c->local_socket, "/run/granary/cachenode.sock"));
  }
  GRANARY_RETURN_IF_ERROR(
      OptionalPositiveDuration(m, "local_socket_idle_timeout", &c->local_socket_idle_timeout));
  GRANARY_RETURN_IF_ERROR(OptionalCount(m, "local_socket_max_per_uid", 1,
                                        kDefaultHandoffMaxConnections,
                                        &c->local_socket_max_per_uid));

  GRANARY_RETURN_IF_ERROR(m.Required("data_dir", &c->data_dir));
  if (c->data_dir.empty() || c->data_dir.front() != '/') {
    return Status::InvalidArgument(m.Where("data_dir") + ": " + Quoted(c->data_dir) +
                                   " is not an absolute path; write the full path of the "
                                   "directory on local NVMe, e.g. /nvme/granary");
  }
  if (HasControlCharacter(c->data_dir)) {
    return Status::InvalidArgument(m.Where("data_dir") + ": " + Quoted(c->data_dir) +
                                   " contains a control character; write a plain path");
  }

  ByteSize capacity;
  GRANARY_RETURN_IF_ERROR(m.Required("capacity", &capacity));
  if (capacity.bytes == 0) {
    return Status::InvalidArgument(m.Where("capacity") +
                                   ": 0 bytes leaves nothing to stage; write the bytes the "
                                   "chunk store may use, e.g. 800GiB");
  }
  c->capacity_bytes = capacity.bytes;

  // The store URL, or a file holding it (a mounted Kubernetes Secret: a
  // Redis password stays out of the ConfigMap). LoadCacheNodeConfig reads it.
  GRANARY_RETURN_IF_ERROR(ParseStoreKeys(m, &c->metadata_store, &c->metadata_store_file));

  GRANARY_RETURN_IF_ERROR(OptionalCount(m, "source_concurrency", 1, kMaxCacheNodeSourceConcurrency,
                                        &c->source_concurrency));
  GRANARY_RETURN_IF_ERROR(
      OptionalCount(m, "worker_threads", 1, kMaxCacheNodeWorkerThreads, &c->worker_threads));
  GRANARY_RETURN_IF_ERROR(
      OptionalCount(m, "service_threads", 1, kMaxCacheNodeServiceThreads, &c->service_threads));
  GRANARY_RETURN_IF_ERROR(
      OptionalCount(m, "max_connections", 1, kMaxCacheNodeConnections, &c->max_connections));
  // Not written, or written without a value: 0, the server's default (a quarter).
  constexpr uint32_t kNotGiven = ~0u;
  uint32_t per_address = kNotGiven;
  GRANARY_RETURN_IF_ERROR(m.Optional("max_connections_per_address", &per_address));
  if (per_address != kNotGiven) {
    if (per_address < 1 || per_address > c->max_connections) {
      return Status::InvalidArgument(
          m.Where("max_connections_per_address") + ": " + std::to_string(per_address) +
          " is out of range; write 1 to 'max_connections' (" + std::to_string(c->max_connections) +
          "), or leave it out for a quarter of it");
    }
    c->max_connections_per_address = per_address;
  }
  GRANARY_RETURN_IF_ERROR(OptionalCount(m, "max_unauthenticated_per_address", 1,
                                        kMaxCacheNodeConnections,
                                        &c->max_unauthenticated_per_address));
  GRANARY_RETURN_IF_ERROR(
      OptionalCount(m, "scan_threads", 1, kMaxCacheNodeScanThreads, &c->scan_threads));
  GRANARY_RETURN_IF_ERROR(ParseReplyBuffers(m, c));

  GRANARY_RETURN_IF_ERROR(
      OptionalPositiveDuration(m, "heartbeat_interval", &c->heartbeat_interval));
  GRANARY_RETURN_IF_ERROR(OptionalPositiveDuration(m, "heartbeat_ttl", &c->heartbeat_ttl));
  GRANARY_RETURN_IF_ERROR(OptionalPositiveDuration(m, "drain_timeout", &c->drain_timeout));
  GRANARY_RETURN_IF_ERROR(
      OptionalPositiveDuration(m, "progress_refresh_interval", &c->progress_refresh_interval));
  GRANARY_RETURN_IF_ERROR(OptionalPositiveDuration(m, "cache_idle_after", &c->cache_idle_after));
  GRANARY_RETURN_IF_ERROR(OptionalPositiveDuration(m, "startup_timeout", &c->startup_timeout));
  GRANARY_RETURN_IF_ERROR(OptionalPositiveDuration(m, "write_timeout", &c->write_timeout));
  GRANARY_RETURN_IF_ERROR(
      OptionalPositiveDuration(m, "reply_stall_timeout", &c->reply_stall_timeout));
  if (c->heartbeat_ttl < kMinNodeTtl || c->heartbeat_ttl > kMaxNodeTtl) {
    return Status::InvalidArgument(m.Where("heartbeat_ttl") + ": " +
                                   DurationText(c->heartbeat_ttl) + " is out of range; write " +
                                   DurationText(kMinNodeTtl) + " to " + DurationText(kMaxNodeTtl));
  }
  if (c->heartbeat_ttl <= 2 * c->heartbeat_interval) {
    // Blame heartbeat_ttl unless only heartbeat_interval is written.
    const bool ttl_given = m.Has("heartbeat_ttl");
    const bool interval_given = m.Has("heartbeat_interval");
    return Status::InvalidArgument(
        m.Where(ttl_given || !interval_given ? "heartbeat_ttl" : "heartbeat_interval") +
        ": 'heartbeat_ttl' (" + DurationText(c->heartbeat_ttl) +
        (ttl_given ? std::string() : ", the default") +
        ") must exceed twice 'heartbeat_interval' (" + DurationText(c->heartbeat_interval) +
        (interval_given ? std::string() : ", the default") +
        "), so that one lost heartbeat does not expire the node; write a heartbeat_ttl above " +
        DurationText(2 * c->heartbeat_interval) + " or a shorter heartbeat_interval");
  }

  GRANARY_RETURN_IF_ERROR(OptionalLogLevel(m, "log_level", &c->log_level));

  std::string scan = "presence";
  GRANARY_RETURN_IF_ERROR(m.Optional("scan_mode", &scan));
  if (scan == "presence") {
    c->scan_mode = ChunkScanMode::kPresence;
  } else if (scan == "verify") {
    c->scan_mode = ChunkScanMode::kVerifyPayload;
  } else {
    return Status::InvalidArgument(m.Where("scan_mode") + ": " + Quoted(scan) +
                                   " is not a scan mode; write presence (trust the bitmaps) or "
                                   "verify (checksum every staged segment at start-up)");
  }

  std::string policy = "resident";
  GRANARY_RETURN_IF_ERROR(m.Optional("cache_policy", &policy));
  if (policy == "resident") {
    c->cache_lru = false;
  } else if (policy == "lru") {
    c->cache_lru = true;
  } else {
    return Status::InvalidArgument(
        m.Where("cache_policy") + ": " + Quoted(policy) +
        " is not a cache policy; write resident (keep the chunks the plans read first, stream "
        "the rest: the default) or lru (cache what is read, evict the least recently used: a "
        "baseline for benchmarks)");
  }

  return m.Finish();
}

}  // namespace

std::string_view ChunkScanModeName(ChunkScanMode mode) {
  switch (mode) {
    case ChunkScanMode::kPresence:
      return "presence";
    case ChunkScanMode::kVerifyPayload:
      return "verify";
  }
  return "unknown";
}

Result<CacheNodeConfig> ParseCacheNodeConfig(std::string_view text, std::string source_name) {
  GRANARY_ASSIGN_OR_RETURN(ConfigMap m, ConfigMap::FromText(text, std::move(source_name)));
  CacheNodeConfig config;
  GRANARY_RETURN_IF_ERROR(Parse(m, &config));
  return config;
}

Result<CacheNodeConfig> LoadCacheNodeConfig(const std::string& path) {
  GRANARY_ASSIGN_OR_RETURN(std::string text, ReadConfigFile(path, "cache node"));
  GRANARY_ASSIGN_OR_RETURN(CacheNodeConfig config, ParseCacheNodeConfig(text, path));
  if (!config.metadata_store_file.empty()) {
    GRANARY_ASSIGN_OR_RETURN(config.metadata_store,
                             ReadStoreUrlFile(path, config.metadata_store_file));
  }
  return config;
}

bool IsLoopbackHost(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  // 127.0.0.0/8, written as a dotted quad.
  in_addr a{};
  return ::inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

Status CheckCacheNodeAuthentication(const CacheNodeConfig& c, const std::string& source) {
  if (!c.cluster_key_file.empty() || !c.kubernetes_auth.empty()) return Status::Ok();
  std::vector<std::string> addresses = {c.listen.ToString()};
  bool loopback = IsLoopbackHost(c.listen.host);
  if (c.fabric_listen) {
    addresses.push_back(c.fabric_listen->ToString());
    loopback = loopback && IsLoopbackHost(c.fabric_listen->host);
  }
  std::string where;
  for (const std::string& a : addresses) where += (where.empty() ? "" : " and ") + a;
  if (!c.serve_without_authentication) {
    return Status::FailedPrecondition(
        source +
        ": no authentication: with neither cluster_key_file nor kubernetes_auth, "
        "whoever reaches " +
        where +
        " could read every dataset this node serves. Make a cluster key (`granary cluster-key "
        "generate` writes /etc/granary/cluster.key, mode 0600) and set cluster_key_file: "
        "/etc/granary/cluster.key here and in the sidecars' configuration; or, in Kubernetes, "
        "set kubernetes_auth (docs/security.md). To serve without authentication on loopback "
        "only (one machine, trusted users), set serve_without_authentication: true");
  }
  if (!loopback && !c.unsafe_serve_without_authentication_beyond_loopback) {
    return Status::FailedPrecondition(
        source + ": serve_without_authentication is true but the node would serve " + where +
        ", which is not loopback only: anyone on the network could read every dataset. Set "
        "cluster_key_file (`granary cluster-key generate`), or listen on 127.0.0.1; only if "
        "every host that can reach it is trusted, set "
        "unsafe_serve_without_authentication_beyond_loopback: true as well");
  }
  return Status::Ok();
}

std::string DataDirOwnershipProblem(const std::string& path, uid_t uid) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return "";  // missing: the node creates it 0700
  if (st.st_uid != uid) {
    return fmt::format(
        "it is owned by uid {}, not by uid {} that the cache node runs as; another user's "
        "directory could hold a symbolic link where the node writes its lock and chunk files: "
        "give the node a directory of its own (chown {} {}; chmod 0700 {})",
        st.st_uid, uid, uid, path, path);
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return fmt::format(
        "its mode {:04o} lets group or others write in it, so they could plant a symbolic link "
        "where the node writes its lock and chunk files: chmod go-w {} (0700 is best)",
        st.st_mode & 07777, path);
  }
  return "";
}

}  // namespace granary

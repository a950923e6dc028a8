#pragma once

// CacheCluster: real granary-cachenode processes on loopback around a real
// redis-server, for the cache node's integration suites
// (tests/integration/cachenode_*_test.cc).
//
//   auto cluster = CacheCluster::Create();          // Redis + a store client
//   ASSERT_OK(cluster->StartNodes(3));               // node-1..3, each /readyz 200
//   auto ds = cluster->CreateDataset({.files = 2000});  // files, manifest, record
//   ASSERT_OK(cluster->WaitForPhase(ds->name, DatasetPhase::kReady));
//   DatasetReader reader(&cluster->store(), *ds);
//   auto got = reader.Read(ds->AllIds());            // each sample from its owner
//   auto opens = cluster->node(0).MetricValue("granary_cachenode_source_opens_total");
//
// What it provides:
//  - CacheNode: one daemon. Start() writes its YAML config (free loopback
//    ports for the protocol and /metrics, a data dir of its own, the cluster's
//    Redis, 200 ms heartbeats with a 1 s TTL) and launches it under a
//    DaemonProcess whose log lands in the cluster's directory and is printed if
//    the test fails; WaitReady() polls /readyz; Metrics() scrapes /metrics and
//    parses the Prometheus text; Terminate()/Kill() stop it; Start() again
//    restarts it on the same config, ports and data dir.
//  - CacheCluster: the temp dir, Redis, a MetadataStore client, the nodes, and
//    datasets: CreateDataset generates files under the temp dir, builds the
//    manifest (BuildManifest), stores it (PutManifest) and creates the dataset
//    record in phase Staging with the manifest id, the pool and an owner
//    (default: this process's uid/gid).
//  - DatasetReader: reads samples the way a sidecar does: each sample from its
//    owner, computed with Placement over ListNodes(pool) (weights = capacity),
//    one PeerClient per node, batched within the protocol limits.
//  - HttpGet, ParsePrometheusText, SumSamples: the small HTTP and Prometheus
//    helpers behind them.
//
// The daemon binary is $GRANARY_CACHENODE_BINARY if set, else the
// GRANARY_CACHENODE_BINARY compile definition of the test target.
//
// Every wait is bounded; every failure is a Status that says what was being
// done, on which node, and (for a node that died) how it ended.
//
// Thread safety: the test's main thread owns the cluster and its nodes (start,
// stop, datasets). Metrics()/MetricValue()/Get() of a node and store() may be
// used from other threads while the node lives. A DatasetReader is used by one
// thread at a time (one per reader thread).

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "granary/core/manifest.h"
#include "granary/core/metadata_store.h"
#include "granary/core/placement.h"
#include "granary/core/status.h"
#include "granary/peer/peer_client.h"
#include "granary/peer/tls.h"
#include "testing/daemon_process.h"
#include "testing/redis_server.h"
#include "testing/test_util.h"

namespace granary::testing {

// ---- HTTP and Prometheus text -------------------------------------------------

struct HttpResponse {
  int status = 0;
  std::string body;
};

// GET http://<address><path> with "Connection: close"; the status and body.
// kUnavailable if it cannot connect, kDeadlineExceeded past `timeout`.
Result<HttpResponse> HttpGet(const std::string& address, const std::string& path,
                             std::chrono::milliseconds timeout = std::chrono::seconds(5));

// One sample of the Prometheus text format: name{labels} value.
struct MetricSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// Parses the text exposition format (comments skipped, label values
// unescaped, an optional timestamp ignored). kInvalidArgument naming the line
// for anything else.
Result<std::vector<MetricSample>> ParsePrometheusText(std::string_view text);

// The sum of the values of the samples called `name` whose labels include all
// of `labels`; nullopt if there is none.
std::optional<double> SumSamples(const std::vector<MetricSample>& samples, std::string_view name,
                                 const std::map<std::string, std::string>& labels = {});

// ---- one cache node -------------------------------------------------------------

std::string CacheNodeBinary();

struct CacheNodeOptions {
  std::string node_id;  // default: node-<n>
  std::string pool = "default";
  uint64_t capacity_bytes = 1ull << 30;
  uint32_t source_concurrency = 4;
  uint32_t worker_threads = 2;
  uint32_t service_threads = 2;
  uint32_t max_connections = 1024;
  std::string heartbeat_interval = "200ms";
  std::string heartbeat_ttl = "1s";
  std::string drain_timeout = "2s";
  std::string log_level = "info";
  std::string metadata_store;  // default: the cluster's Redis
  std::string data_dir;        // default: <cluster dir>/<node id>/data
  std::string extra_yaml;      // appended to the config as is ("key: value\n" lines)
  // A node whose extra_yaml sets neither cluster_key_file nor kubernetes_auth
  // gets serve_without_authentication: true (and, on a host that is not
  // loopback, unsafe_serve_without_authentication_beyond_loopback), the
  // explicit opt-out, unless this is false (then it refuses to start).
  bool opt_out_of_authentication = true;
};

// What every daemon under test has: a config written before each start, a
// DaemonProcess with its log, a /metrics + /readyz endpoint.
class TestDaemon {
 public:
  // `name` is for messages and the process; files go under `dir`.
  TestDaemon(std::string name, std::string binary, std::string dir, std::string file_stem);
  virtual ~TestDaemon();
  TestDaemon(const TestDaemon&) = delete;
  TestDaemon& operator=(const TestDaemon&) = delete;

  const std::string& name() const { return name_; }
  const std::string& config_path() const { return config_path_; }
  const std::string& log_path() const { return log_path_; }
  // "<host>:<port>" of /metrics, /healthz, /readyz (host 127.0.0.1 unless
  // BindTo said otherwise).
  std::string metrics_address() const;

  // Runs the daemon as `prefix... binary args...` from the next Start (e.g.
  // NetnsHosts::ExecPrefix: `ip netns exec <ns>`, which execs the daemon in
  // place, so the process handle is still the daemon's). Empty: directly.
  void RunThrough(std::vector<std::string> prefix) { command_prefix_ = std::move(prefix); }
  // The IPv4 address its ports listen on (and a cache node advertises) from
  // the next Start, instead of 127.0.0.1: a host's address inside a network
  // namespace. Ports are chosen again.
  void BindTo(std::string host);
  const std::string& host() const { return host_; }

  // The YAML this daemon runs with (ports chosen on the first call).
  virtual std::string ConfigYaml() = 0;

  // Writes the config file and starts the daemon (`--config FILE` plus
  // `extra_args`); does not wait. A daemon still running is an error.
  Status Start(std::vector<std::string> extra_args = {});
  // Waits until /readyz answers 200. Fails early, with the exit status and the
  // log's tail, if the process exits; at the deadline with the last answer.
  Status WaitReady(std::chrono::milliseconds timeout = std::chrono::seconds(60));
  // Start, then WaitReady; if the daemon could not bind a port (taken since it
  // was chosen), retries on fresh ports a few times.
  Status StartAndWaitReady(std::chrono::milliseconds timeout = std::chrono::seconds(60));
  bool Running();
  DaemonProcess* process() { return process_.get(); }
  Result<ExitStatus> Terminate(std::chrono::milliseconds timeout = std::chrono::seconds(30));
  Result<ExitStatus> Kill();
  // Waits for the process to exit by itself (start-up errors).
  Result<ExitStatus> WaitExit(std::chrono::milliseconds timeout = std::chrono::seconds(30));
  std::string Log() const;

  Result<HttpResponse> Get(const std::string& path) const;
  Result<std::vector<MetricSample>> Metrics() const;
  // SumSamples over a fresh scrape; kNotFound if no sample matches.
  Result<double> MetricValue(std::string_view name,
                             const std::map<std::string, std::string>& labels = {}) const;
  // Waits until `holds(value)` for MetricValue(name, labels) (metrics are
  // refreshed about every 500 ms): the value then. At the deadline
  // kDeadlineExceeded with the last value or error.
  Result<double> WaitForMetric(std::string_view name,
                               const std::map<std::string, std::string>& labels,
                               const std::function<bool(double)>& holds,
                               std::chrono::milliseconds timeout = std::chrono::seconds(20)) const;
  // Waits until two scrapes `gap` apart (more than one refresh) agree on a
  // value for which `holds`: the value then, once the work behind it stopped.
  Result<double> WaitForSettledMetric(
      std::string_view name, const std::map<std::string, std::string>& labels,
      const std::function<bool(double)>& holds,
      std::chrono::milliseconds gap = std::chrono::milliseconds(1200),
      std::chrono::milliseconds timeout = std::chrono::seconds(20)) const;

 protected:
  // Picks free ports (the metrics port here; subclasses add theirs).
  virtual void ChoosePorts();

  std::string name_;
  std::string binary_;
  std::string dir_;  // config, log (and whatever the daemon keeps)
  std::string config_path_;
  std::string log_path_;
  std::string host_ = "127.0.0.1";
  std::vector<std::string> command_prefix_;
  uint16_t metrics_port_ = 0;
  std::unique_ptr<DaemonProcess> process_;
};

class CacheNode : public TestDaemon {
 public:
  CacheNode(CacheNodeOptions options, std::string dir);
  ~CacheNode() override;

  const CacheNodeOptions& options() const { return options_; }
  CacheNodeOptions& mutable_options() { return options_; }  // applies at the next Start
  const std::string& id() const { return options_.node_id; }
  // "<host>:<port>": the protocol (listen = advertise).
  std::string address() const;
  const std::string& data_dir() const { return options_.data_dir; }

  std::string ConfigYaml() override;

  // A PeerClient connected to this node.
  Result<PeerClient> Connect(
      std::chrono::milliseconds call_timeout = std::chrono::seconds(20)) const;
  // The chunk files (*.chunk) under the data dir, sorted.
  std::vector<std::string> ChunkFiles() const;

 private:
  void ChoosePorts() override;

  CacheNodeOptions options_;
  uint16_t port_ = 0;
};

// ---- datasets -------------------------------------------------------------------

struct DatasetOptions {
  std::string name = "ds";
  size_t files = 2000;
  // Sizes are drawn deterministically from [min_size, max_size]; min_size >= 1.
  size_t min_size = 1024;
  size_t max_size = 6 * 1024;
  size_t files_per_directory = 100;
  uint64_t chunk_size = 256 * 1024;
  std::string pool = "default";
  uint32_t replication = 1;
  std::optional<DatasetOwner> owner;  // default: this process's uid and gid
  // The cache nodes it is placed on (DatasetSpec::nodes); default the pool.
  std::optional<std::vector<std::string>> nodes;
  // DatasetSpec::kubernetes_namespace (which pods' tokens may read it).
  std::string kubernetes_namespace;
  // Called with the source root after the files are written, before the
  // snapshot (permissions, ownership).
  std::function<void(const std::string& root)> before_snapshot;
};

struct TestDataset {
  std::string name;
  std::string pool;
  std::string root;  // the source tree
  std::shared_ptr<const Manifest> manifest;
  ContentId manifest_id;
  std::vector<std::string> contents;  // by sample id: the bytes at snapshot time
  uint64_t total_bytes = 0;

  size_t sample_count() const { return contents.size(); }
  std::vector<SampleId> AllIds() const;
  std::string PathOf(SampleId id) const { return root + "/" + manifest->PathOf(id); }
};

// ---- reading as a sidecar does ----------------------------------------------------

// The owners of a dataset's chunks as every node computes them: Placement
// over ListNodes(pool), weight = capacity_bytes.
Result<Placement> PlacementOf(MetadataStore& store, const std::string& pool,
                              std::map<std::string, std::string>* addresses = nullptr);
// The same over node records already read.
Result<Placement> PlacementOf(const std::vector<NodeRecord>& nodes,
                              std::map<std::string, std::string>* addresses = nullptr);

class DatasetReader {
 public:
  struct Outcome {
    Status status;      // the item's status, or the request's / connection's
    std::string bytes;  // when OK
    std::string node;   // the node asked
  };

  DatasetReader(MetadataStore* store, const TestDataset& dataset,
                std::chrono::milliseconds call_timeout = std::chrono::seconds(20));

  // What the reader proves to nodes that require authentication (none by default).
  void SetCredentials(ClientCredentials credentials) {
    credentials_ = std::move(credentials);
    clients_.clear();
  }
  // How to speak to nodes whose record says they serve TLS (default: an
  // unverifying client context).
  void SetTls(std::shared_ptr<const TlsContext> tls) {
    tls_ = std::move(tls);
    clients_.clear();
  }

  // Re-reads the live nodes and recomputes placement.
  Status Refresh();
  // Reads whole samples, each from its owner (Refresh first if never done).
  // Failures are per sample; a failed request or connection fails its batch.
  std::vector<Outcome> Read(const std::vector<SampleId>& ids);
  // Reads whole samples from one node, owner or not.
  std::vector<Outcome> ReadFrom(const std::string& node_id, const std::vector<SampleId>& ids);
  // The node owning the sample's chunk now (after Refresh); kNotFound if none.
  Result<std::string> OwnerOf(SampleId id) const;

  // Reads `ids` until each one returned bytes, retrying failed ones (with a
  // Refresh) until `timeout`. Returns how many bytes were wrong: a sample
  // returning bytes other than the snapshot's is recorded in `wrong` and not
  // retried. kDeadlineExceeded naming the samples still failing (and why) at
  // the deadline.
  Status ReadAllCorrect(const std::vector<SampleId>& ids, std::chrono::milliseconds timeout,
                        std::vector<std::string>* wrong);

 private:
  Result<PeerClient*> ClientFor(const std::string& node_id);

  MetadataStore* store_;
  const TestDataset* dataset_;
  std::chrono::milliseconds call_timeout_;
  ClientCredentials credentials_;
  std::shared_ptr<const TlsContext> tls_;
  std::set<std::string> tls_addresses_;  // nodes serving TLS (their records' label)
  Placement placement_;
  bool refreshed_ = false;
  std::map<std::string, std::string> addresses_;  // node id -> host:port
  std::map<std::string, PeerClient> clients_;     // address -> client
};

// ---- the cluster ----------------------------------------------------------------

class CacheCluster {
 public:
  // A temp dir, a redis-server and a store client on it.
  static Result<std::unique_ptr<CacheCluster>> Create();
  // The same with `redis_args` appended to redis-server's command line, e.g.
  // {"--bind", "127.0.0.1", "<bridge address>"} for nodes in other network
  // namespaces (the store client here stays on 127.0.0.1).
  static Result<std::unique_ptr<CacheCluster>> Create(std::vector<std::string> redis_args);
  // A temp dir and a store client on a store the test runs itself (e.g. a
  // redis+sentinel:// URL of a RedisSentinelSet); redis() must not be called.
  static Result<std::unique_ptr<CacheCluster>> CreateOnStore(std::string store_url);
  ~CacheCluster();
  CacheCluster(const CacheCluster&) = delete;
  CacheCluster& operator=(const CacheCluster&) = delete;

  const TempDir& dir() const { return dir_; }
  RedisServer& redis() { return *redis_; }
  MetadataStore& store() { return *store_; }
  std::string store_url() const { return redis_ != nullptr ? redis_->url() : store_url_; }

  // A node, not started: ids node-1, node-2, ... unless options.node_id is set;
  // data dir and store URL filled in when empty.
  CacheNode& AddNode(CacheNodeOptions options = {});
  // Adds `n` nodes with `base` (ids numbered on), starts them all, then waits
  // for each to be ready.
  Status StartNodes(size_t n, const CacheNodeOptions& base = {});
  CacheNode& node(size_t i) { return *nodes_.at(i); }
  CacheNode* FindNode(std::string_view id);
  size_t node_count() const { return nodes_.size(); }

  // Files, manifest, record (phase Staging).
  Result<TestDataset> CreateDataset(const DatasetOptions& options);
  // A dataset over a tree the test wrote itself: snapshots `root` (chunks of
  // `chunk_size`) and registers it as RegisterManifest does; the manifest.
  Result<std::shared_ptr<const Manifest>> RegisterTree(const std::string& name,
                                                       const std::string& root,
                                                       uint64_t chunk_size = 16 * 1024);
  // Stores `manifest` and creates dataset `name` over it: pool "default",
  // replication 1, this process's uid and gid, phase Staging.
  Status RegisterManifest(const std::string& name, const Manifest& manifest);

  // Waits until the dataset's phase is `phase`: the record then. At the
  // deadline kDeadlineExceeded with the record, progress and nodes.
  Result<DatasetRecord> WaitForPhase(const std::string& dataset, DatasetPhase phase,
                                     std::chrono::milliseconds timeout = std::chrono::seconds(60));
  // Dataset record, progress per node and live nodes, for failure messages.
  std::string Describe(const std::string& dataset);

  // The sum over running nodes of a metric (nodes not answering are skipped).
  double SumMetric(std::string_view name, const std::map<std::string, std::string>& labels = {});

 private:
  CacheCluster() = default;

  TempDir dir_;
  std::unique_ptr<RedisServer> redis_;  // null: CreateOnStore
  std::string store_url_;               // CreateOnStore's
  std::unique_ptr<MetadataStore> store_;
  std::vector<std::unique_ptr<CacheNode>> nodes_;  // destroyed (killed) first
  size_t next_node_ = 1;
};

}  // namespace granary::testing

#include "granary/config/cachenode_config.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "granary/core/metadata_store.h"
#include "testing/child_process.h"
#include "testing/test_util.h"

namespace granary {
namespace {

// The required keys, one per line, in this order (lines 1..3).
const std::vector<std::pair<std::string, std::string>> kRequired = {
    {"data_dir", "/nvme/granary"},
    {"capacity", "1GiB"},
    {"metadata_store", "sqlite:///var/lib/granary/granary.db"},
};

// The required keys with `key` set to `value` (replaced in place, or appended
// as line 4), or removed if `value` is null.
std::string With(const std::string& key, const char* value) {
  std::string text;
  bool placed = false;
  for (const auto& [k, v] : kRequired) {
    if (k == key) {
      placed = true;
      if (value == nullptr) continue;
      text += k + ": " + value + "\n";
    } else {
      text += k + ": " + v + "\n";
    }
  }
  if (!placed && value != nullptr) text += key + ": " + value + "\n";
  return text;
}

// The line `key` is on in With(key, ...).
int LineOf(const std::string& key) {
  for (size_t i = 0; i < kRequired.size(); ++i) {
    if (kRequired[i].first == key) return static_cast<int>(i) + 1;
  }
  return static_cast<int>(kRequired.size()) + 1;
}

std::string HostName() {
  char host[256] = {};
  EXPECT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  return host;
}

// Parses `text` as "node.yaml" and expects kInvalidArgument whose message
// holds every one of `parts`.
void ExpectError(const std::string& text, const std::vector<std::string>& parts) {
  Result<CacheNodeConfig> c = ParseCacheNodeConfig(text, "node.yaml");
  ASSERT_FALSE(c.ok()) << "parsed:\n" << text;
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status().ToString();
  for (const auto& part : parts) {
    EXPECT_NE(c.status().message().find(part), std::string::npos)
        << "'" << part << "' not in: " << c.status().message() << "\nfor:\n"
        << text;
  }
}

// A bad value for `key`: the message names the file and line, the key, the
// value (as written, or as the parser shows it) and `hint`.
void ExpectBadValue(const std::string& key, const char* value, const std::string& shown,
                    const std::string& hint) {
  SCOPED_TRACE(key + ": " + value);
  ExpectError(With(key, value),
              {"node.yaml:" + std::to_string(LineOf(key)) + ": key '" + key + "'", shown, hint});
}

std::string ExamplePath() {
  return (std::filesystem::path(__FILE__).parent_path() / ".." / ".." / "examples" /
          "cachenode.yaml")
      .lexically_normal()
      .string();
}

TEST(CacheNodeConfigTest, TheExampleFileParses) {
  const std::string path = ExamplePath();
  ASSERT_TRUE(std::filesystem::is_regular_file(path)) << path;
  Result<CacheNodeConfig> c = LoadCacheNodeConfig(path);
  ASSERT_OK(c);
  EXPECT_EQ(c->node_id, "gpu-7");
  EXPECT_EQ(c->pool, "default");
  EXPECT_EQ(c->listen, (NetAddress{"0.0.0.0", 7070}));
  EXPECT_EQ(c->advertise, (NetAddress{"gpu-7.cluster.local", 7070}));
  EXPECT_EQ(c->data_dir, "/nvme/granary");
  EXPECT_EQ(c->capacity_bytes, 800ull << 30);
  EXPECT_EQ(c->metadata_store, "redis://10.0.0.2:6379/0");
  EXPECT_EQ(c->source_concurrency, 16u);
  EXPECT_EQ(c->worker_threads, 2u);
  EXPECT_EQ(c->service_threads, 4u);
  EXPECT_EQ(c->max_connections, 1024u);
  EXPECT_EQ(c->metrics_listen, (NetAddress{"127.0.0.1", 9464}));
  EXPECT_EQ(c->heartbeat_interval, std::chrono::seconds(2));
  EXPECT_EQ(c->heartbeat_ttl, std::chrono::seconds(10));
  EXPECT_EQ(c->drain_timeout, std::chrono::seconds(5));
  EXPECT_EQ(c->startup_timeout, std::chrono::seconds(30));
  EXPECT_EQ(c->log_level, spdlog::level::info);
  EXPECT_EQ(c->scan_mode, ChunkScanMode::kPresence);
  EXPECT_EQ(c->scan_threads, 4u);
  EXPECT_EQ(c->reply_buffer_bytes, 256ull << 20);
  EXPECT_EQ(c->connection_reply_buffer_bytes, 64ull << 20);
  EXPECT_EQ(c->write_timeout, std::chrono::seconds(30));
  EXPECT_EQ(c->reply_stall_timeout, std::chrono::seconds(5));
}

TEST(CacheNodeConfigTest, TheExampleSetsEveryKeyTheParserKnows) {
  // Every key the parser accepts appears in the example: a key added to the
  // parser without documenting it here fails this test, because the unknown-key
  // message lists the known keys and each must be in the file.
  Result<CacheNodeConfig> c = ParseCacheNodeConfig(With("zzzzzzzzzzzz", "1"), "node.yaml");
  ASSERT_FALSE(c.ok());
  const std::string& msg = c.status().message();
  size_t at = msg.find("known keys:");
  ASSERT_NE(at, std::string::npos) << msg;
  const std::string example = testing::ReadAll(ExamplePath());
  std::string rest = msg.substr(at + 11);
  size_t keys = 0;
  for (size_t pos = 0; pos < rest.size();) {
    size_t end = rest.find(' ', pos + 1);
    if (end == std::string::npos) end = rest.size();
    std::string key = rest.substr(pos + 1, end - pos - 1);
    pos = end;
    if (key.empty()) continue;
    ++keys;
    // metadata_store_file replaces metadata_store, and fabric_listen cannot go
    // with the example's TLS: the example shows them commented out.
    // The opt-outs of authentication are shown commented out too.
    const bool alternative = key == "metadata_store_file" || key == "fabric_listen" ||
                             key == "serve_without_authentication" ||
                             key == "unsafe_serve_without_authentication_beyond_loopback";
    EXPECT_NE(example.find(alternative ? "\n# " + key + ": " : "\n" + key + ": "),
              std::string::npos)
        << key << " not in the example";
  }
  EXPECT_EQ(keys, 42u) << msg;
}

TEST(CacheNodeConfigTest, Defaults) {
  Result<CacheNodeConfig> c = ParseCacheNodeConfig(With("", nullptr), "node.yaml");
  ASSERT_OK(c);
  const std::string host = HostName();
  if (ValidateNodeId(host).ok()) {
    EXPECT_EQ(c->node_id, host);
  }
  EXPECT_EQ(c->pool, "default");
  EXPECT_EQ(c->listen, (NetAddress{"0.0.0.0", kDefaultCacheNodePort}));
  EXPECT_EQ(c->advertise, (NetAddress{host, kDefaultCacheNodePort}));
  EXPECT_EQ(c->data_dir, "/nvme/granary");
  EXPECT_EQ(c->capacity_bytes, 1ull << 30);
  EXPECT_EQ(c->metadata_store, "sqlite:///var/lib/granary/granary.db");
  EXPECT_EQ(c->source_concurrency, 16u);
  EXPECT_EQ(c->worker_threads, 2u);
  EXPECT_EQ(c->service_threads, 4u);
  EXPECT_EQ(c->max_connections, 1024u);
  EXPECT_EQ(c->metrics_listen, (NetAddress{"127.0.0.1", kDefaultMetricsPort}));
  EXPECT_EQ(c->heartbeat_interval, std::chrono::seconds(2));
  EXPECT_EQ(c->heartbeat_ttl, std::chrono::seconds(10));
  EXPECT_EQ(c->drain_timeout, std::chrono::seconds(5));
  EXPECT_EQ(c->log_level, spdlog::level::info);
  EXPECT_EQ(c->scan_mode, ChunkScanMode::kPresence);
  EXPECT_EQ(c->scan_threads, 4u);
  EXPECT_EQ(c->reply_buffer_bytes, 256ull << 20);
  EXPECT_EQ(c->connection_reply_buffer_bytes, 0u);  // the server's default: a quarter
  EXPECT_EQ(c->write_timeout, std::chrono::seconds(30));
  EXPECT_EQ(c->reply_stall_timeout, std::chrono::seconds(5));
}

TEST(CacheNodeConfigTest, KeysWithoutAValueTakeTheirDefaults) {
  std::string text = With("", nullptr) +
                     "node_id:\nlisten:\nadvertise:\npool:\nscan_mode:\nreply_buffer_bytes:\n"
                     "connection_reply_buffer_bytes:\n";
  Result<CacheNodeConfig> c = ParseCacheNodeConfig(text, "node.yaml");
  ASSERT_OK(c);
  EXPECT_EQ(c->reply_buffer_bytes, 256ull << 20);
  EXPECT_EQ(c->connection_reply_buffer_bytes, 0u);
  EXPECT_EQ(c->pool, "default");
  EXPECT_EQ(c->listen, (NetAddress{"0.0.0.0", kDefaultCacheNodePort}));
  EXPECT_EQ(c->advertise.port, kDefaultCacheNodePort);
}

TEST(CacheNodeConfigTest, EveryFieldSet) {
  std::string text = With("", nullptr) +
                     "node_id: Node_3.rack-2\n"
                     "pool: a100-east\n"
                     "listen: '[::1]:0'\n"
                     "metrics_listen: 0.0.0.0:0\n"
                     "source_concurrency: 1024\n"
                     "worker_threads: 64\n"
                     "service_threads: 1\n"
                     "max_connections: 65536\n"
                     "scan_threads: 64\n"
                     "heartbeat_interval: 250ms\n"
                     "heartbeat_ttl: 501ms\n"
                     "drain_timeout: 1m\n"
                     "startup_timeout: 750ms\n"
                     "log_level: debug\n"
                     "scan_mode: verify\n"
                     "reply_buffer_bytes: 1TiB\n"
                     "connection_reply_buffer_bytes: 1TiB\n"
                     "write_timeout: 2s\n"
                     "reply_stall_timeout: 500ms\n";
  Result<CacheNodeConfig> c = ParseCacheNodeConfig(text, "node.yaml");
  ASSERT_OK(c);
  EXPECT_EQ(c->node_id, "Node_3.rack-2");
  EXPECT_EQ(c->pool, "a100-east");
  EXPECT_EQ(c->listen, (NetAddress{"::1", 0}));
  // A specific listen host is advertised as is; port 0 is filled in after bind.
  EXPECT_EQ(c->advertise, (NetAddress{"::1", 0}));
  EXPECT_EQ(c->metrics_listen, (NetAddress{"0.0.0.0", 0}));
  EXPECT_EQ(c->source_concurrency, 1024u);
  EXPECT_EQ(c->worker_threads, 64u);
  EXPECT_EQ(c->service_threads, 1u);
  EXPECT_EQ(c->max_connections, 65536u);
  EXPECT_EQ(c->scan_threads, 64u);
  EXPECT_EQ(c->heartbeat_interval, std::chrono::milliseconds(250));
  EXPECT_EQ(c->heartbeat_ttl, std::chrono::milliseconds(501));
  EXPECT_EQ(c->drain_timeout, std::chrono::minutes(1));
  EXPECT_EQ(c->startup_timeout, std::chrono::milliseconds(750));
  EXPECT_EQ(c->log_level, spdlog::level::debug);
  EXPECT_EQ(c->scan_mode, ChunkScanMode::kVerifyPayload);
  EXPECT_EQ(c->reply_buffer_bytes, 1ull << 40);
  EXPECT_EQ(c->connection_reply_buffer_bytes, 1ull << 40);
  EXPECT_EQ(c->write_timeout, std::chrono::seconds(2));
  EXPECT_EQ(c->reply_stall_timeout, std::chrono::milliseconds(500));
}

TEST(CacheNodeConfigTest, ReplyBuffers) {
  // The least of each, and the share equal to the whole.
  Result<CacheNodeConfig> c = ParseCacheNodeConfig(
      With("", nullptr) + "reply_buffer_bytes: 64MiB\nconnection_reply_buffer_bytes: 1MiB\n",
      "node.yaml");
  ASSERT_OK(c);
  EXPECT_EQ(c->reply_buffer_bytes, 64ull << 20);
  EXPECT_EQ(c->connection_reply_buffer_bytes, 1ull << 20);
  c = ParseCacheNodeConfig(
      With("", nullptr) + "reply_buffer_bytes: 100MB\nconnection_reply_buffer_bytes: 100MB\n",
      "node.yaml");
  ASSERT_OK(c);
  EXPECT_EQ(c->connection_reply_buffer_bytes, 100'000'000u);

  const std::string range = "write 64MiB (one READ of the largest size) to 1024GiB";
  ExpectBadValue("reply_buffer_bytes", "0", "0 bytes is out of range", range);
  ExpectBadValue("reply_buffer_bytes", "63MiB", "63MiB is out of range", range);
  ExpectBadValue("reply_buffer_bytes", "2TiB", "2048GiB is out of range", range);
  ExpectBadValue("reply_buffer_bytes", "lots", "'lots'", "");
  ExpectBadValue("reply_buffer_bytes", "-1MiB", "'-1MiB'", "");
  ExpectBadValue("reply_buffer_bytes", "[1GiB]", "expected a single value", "not a list or map");

  // The share: 1MiB up to reply_buffer_bytes, written or the default.
  ExpectBadValue("connection_reply_buffer_bytes", "0", "0 bytes is out of range",
                 "write 1MiB to 'reply_buffer_bytes' (256MiB, the default)");
  ExpectBadValue("connection_reply_buffer_bytes", "512KiB", "524288 bytes is out of range",
                 "write 1MiB to 'reply_buffer_bytes' (256MiB, the default)");
  ExpectBadValue("connection_reply_buffer_bytes", "257MiB", "257MiB is out of range",
                 "or leave it out for a quarter of 'reply_buffer_bytes'");
  ExpectError(
      With("", nullptr) + "reply_buffer_bytes: 128MiB\nconnection_reply_buffer_bytes: 129MiB\n",
      {"node.yaml:5: key 'connection_reply_buffer_bytes': 129MiB is out of range",
       "write 1MiB to 'reply_buffer_bytes' (128MiB)"});
}

TEST(CacheNodeConfigTest, CapacityUnitsAndStoreUrls) {
  struct Case {
    const char* text;
    uint64_t bytes;
  };
  for (const Case& k : {Case{"1", 1}, Case{"4k", 4096}, Case{"100MB", 100'000'000},
                        Case{"1.5 GiB", 3ull << 29}, Case{"2TiB", 2ull << 40}}) {
    Result<CacheNodeConfig> c = ParseCacheNodeConfig(With("capacity", k.text), "node.yaml");
    ASSERT_OK(c);
    EXPECT_EQ(c->capacity_bytes, k.bytes) << k.text;
  }
  for (const char* url :
       {"redis://localhost", "redis://:secret@10.0.0.2:6379/3?prefix=g&timeout_ms=500",
        "redis://[::1]:6379", "sqlite:///tmp/g.db?retry_ms=5",
        "redis+sentinel://10.0.0.2,10.0.0.3:26380,10.0.0.4/granary/0?retry_ms=20000"}) {
    Result<CacheNodeConfig> c = ParseCacheNodeConfig(With("metadata_store", url), "node.yaml");
    ASSERT_OK(c);
    EXPECT_EQ(c->metadata_store, url);
  }
}

TEST(CacheNodeConfigTest, AdvertiseDefaultsToTheHostNameBehindAWildcard) {
  Result<CacheNodeConfig> c = ParseCacheNodeConfig(With("listen", "'[::]:7171'"), "node.yaml");
  ASSERT_OK(c);
  EXPECT_EQ(c->advertise, (NetAddress{HostName(), 7171}));
  c = ParseCacheNodeConfig(With("listen", "10.1.2.3:7171"), "node.yaml");
  ASSERT_OK(c);
  EXPECT_EQ(c->advertise, (NetAddress{"10.1.2.3", 7171}));
  c = ParseCacheNodeConfig(With("advertise", "'[fe80::1%eth0]:9000'"), "node.yaml");
  ASSERT_OK(c);
  EXPECT_EQ(c->advertise, (NetAddress{"fe80::1%eth0", 9000}));
}

TEST(CacheNodeConfigTest, BadNodeIdAndPool) {
  ExpectBadValue("node_id", "-gpu", "'-gpu'", "write e.g. gpu-7");
  ExpectBadValue("node_id", "'gpu 7'", "'gpu 7'", "write e.g. gpu-7");
  ExpectBadValue("node_id", "\"gpu\\x01\"", "'gpu\\x01'", "write e.g. gpu-7");
  ExpectBadValue("node_id", "''", "''", "write e.g. gpu-7");
  ExpectBadValue("node_id", std::string(254, 'a').c_str(), "aaaa", "write e.g. gpu-7");
  ExpectBadValue("node_id", "[a, b]", "expected a single value", "not a list or map");
  ExpectBadValue("local_socket", "node.sock", "'node.sock'", "not an absolute path");
  ExpectBadValue("local_socket_idle_timeout", "0s", "local_socket_idle_timeout", "");
  ExpectBadValue("local_socket_max_per_uid", "0", "local_socket_max_per_uid", "");
  ExpectBadValue("local_socket_max_per_uid", "65", "local_socket_max_per_uid", "");
  ExpectBadValue("local_socket", ("/" + std::string(200, 's')).c_str(), "sss",
                 "a Unix socket path holds at most 107");
  ExpectBadValue("pool", "Default", "'Default'", "DNS-1123 label");
  ExpectBadValue("pool", "a_b", "'a_b'", "DNS-1123 label");
  ExpectBadValue("pool", "''", "''", "DNS-1123 label");
  ExpectBadValue("pool", std::string(64, 'a').c_str(), "aaaa", "DNS-1123 label");
  ExpectBadValue("pool", "{a: b}", "expected a single value", "not a list or map");
}

TEST(CacheNodeConfigTest, BadAddresses) {
  ExpectBadValue("listen", "localhost", "listen address 'localhost'", "host:port");
  ExpectBadValue("listen", "1.2.3.4:70000", "'1.2.3.4:70000'", "65535");
  ExpectBadValue("listen", "'::1:7070'", "'::1:7070'", "bracket");
  ExpectBadValue("listen", "'host:-1'", "'host:-1'", "port");
  ExpectBadValue("listen", "''", "listen address ''", "host:port");
  ExpectBadValue("listen", "[a, b]", "expected a single value", "not a list or map");
  ExpectBadValue("metrics_listen", "':9464'", "metrics listen address ':9464'", "host:port");
  ExpectBadValue("metrics_listen", "'[zz::1]:80'", "'[zz::1]:80'", "IPv6");
  ExpectBadValue("advertise", "gpu-7", "advertised address 'gpu-7'", "host:port");
  ExpectBadValue("advertise", "0.0.0.0:7070", "'0.0.0.0:7070'", "peers reach this node at");
  ExpectBadValue("advertise", "'[::]:7070'", "'[::]:7070'", "peers reach this node at");
  ExpectBadValue("advertise", "gpu-7:0", "'gpu-7:0'", "peers reach this node at");
}

TEST(CacheNodeConfigTest, ListenAndMetricsOnTheSamePortAreRejected) {
  std::string text = With("listen", "0.0.0.0:9464");  // metrics default 127.0.0.1:9464
  ExpectError(text, {"node.yaml:4: key 'listen'", "'listen' ('0.0.0.0:9464')",
                     "'metrics_listen' ('127.0.0.1:9464', the default)", "another port"});
  text = With("listen", "127.0.0.1:7070") + "metrics_listen: 127.0.0.1:7070\n";
  ExpectError(text, {"node.yaml:5: key 'metrics_listen'", "use the same port"});
  text = With("listen", "'[::1]:7070'") + "metrics_listen: '[::]:7070'\n";
  ExpectError(text, {"node.yaml:5: key 'metrics_listen'", "use the same port"});
  // Different specific hosts may share a port; port 0 never clashes.
  text = With("listen", "10.0.0.1:9000") + "metrics_listen: 127.0.0.1:9000\n";
  EXPECT_OK(ParseCacheNodeConfig(text, "node.yaml"));
  text = With("listen", "127.0.0.1:0") + "metrics_listen: 127.0.0.1:0\n";
  EXPECT_OK(ParseCacheNodeConfig(text, "node.yaml"));
}

TEST(CacheNodeConfigTest, Fabric) {
  Result<CacheNodeConfig> c = ParseCacheNodeConfig(With("data_dir", "/nvme/g"), "node.yaml");
  ASSERT_OK(c);
  EXPECT_FALSE(c->fabric_listen.has_value());  // off by default
  EXPECT_EQ(c->fabric_provider, "tcp");
  c = ParseCacheNodeConfig(With("fabric_listen", "0.0.0.0:7071") + "fabric_provider: verbs\n",
                           "node.yaml");
  ASSERT_OK(c);
  EXPECT_EQ(c->fabric_listen, (NetAddress{"0.0.0.0", 7071}));
  EXPECT_EQ(c->fabric_provider, "verbs");
  // Written without a value: off.
  c = ParseCacheNodeConfig(With("fabric_listen", ""), "node.yaml");
  ASSERT_OK(c);
  EXPECT_FALSE(c->fabric_listen.has_value());
  // A provider this host lacks is no configuration error (the node falls
  // back to TCP at start); a name that is no provider's is.
  EXPECT_OK(ParseCacheNodeConfig(With("fabric_provider", "nosuchprovider"), "node.yaml"));

  ExpectBadValue("fabric_listen", "gpu-7", "fabric listen address 'gpu-7'", "host:port");
  ExpectBadValue("fabric_listen", "1.2.3.4:70000", "'1.2.3.4:70000'", "65535");
  ExpectBadValue("fabric_provider", "'Verbs!'", "'Verbs!'", "fi_info -l");
  ExpectBadValue("fabric_provider", "''", "''", "write tcp");
  // With TLS: refused, saying why and what to do.
  std::string text = With("fabric_listen", "0.0.0.0:7071") +
                     "tls_cert_file: /etc/n.crt\ntls_key_file: /etc/n.key\n";
  ExpectError(text, {"node.yaml:4: key 'fabric_listen'", "no encryption", "'tls_cert_file'",
                     "leave 'fabric_listen' out"});
  // The port of `listen`.
  text = With("listen", "0.0.0.0:7070") + "fabric_listen: 127.0.0.1:7070\n";
  ExpectError(
      text, {"node.yaml:5: key 'fabric_listen'", "uses the port of 'listen'", "a port of its own"});
  text = With("listen", "0.0.0.0:0") + "fabric_listen: 127.0.0.1:0\n";  // port 0 never clashes
  EXPECT_OK(ParseCacheNodeConfig(text, "node.yaml"));
}

TEST(CacheNodeConfigTest, BadDataDir) {
  for (const char* dir : {"nvme/granary", "./granary", "~/granary", "''", "granary"}) {
    ExpectBadValue("data_dir", dir, "not an absolute path", "e.g. /nvme/granary");
  }
  ExpectBadValue("data_dir", "\"/nvme/\\tgranary\"", "'/nvme/\\x09granary'", "control character");
  ExpectBadValue("data_dir", "[/a, /b]", "expected a single value", "not a list or map");
}

TEST(CacheNodeConfigTest, BadCapacity) {
  ExpectBadValue("capacity", "0", "0 bytes", "e.g. 800GiB");
  ExpectBadValue("capacity", "0GiB", "0 bytes", "e.g. 800GiB");
  for (const char* bad : {"-1GiB", "10XB", "lots", "1.5.5GiB", "99999999999TiB", "GiB", "1 Gib"}) {
    SCOPED_TRACE(bad);
    ExpectError(With("capacity", bad), {"node.yaml:2: key 'capacity'", bad});
  }
}

TEST(CacheNodeConfigTest, BadStoreUrl) {
  const std::string kBoth =
      "redis://host[:port][/db], redis+sentinel://s1,s2,s3/MASTER[/db] or "
      "sqlite:///absolute/path/granary.db";
  ExpectBadValue("metadata_store", "mysql://db/granary", "'mysql://db/granary'", kBoth);
  ExpectBadValue("metadata_store", "/var/granary.db", "'/var/granary.db'", kBoth);
  ExpectBadValue("metadata_store", "REDIS://host", "'REDIS://host'", kBoth);
  ExpectBadValue("metadata_store", "redis://", "'redis://'", "names no Redis host");
  ExpectBadValue("metadata_store", "redis:///0", "'redis:///0'", "names no Redis host");
  ExpectBadValue("metadata_store", "redis+sentinel://", "'redis+sentinel://'",
                 "names no sentinel or no master");
  ExpectBadValue("metadata_store", "redis+sentinel://s1,s2", "'redis+sentinel://s1,s2'",
                 "names no sentinel or no master");
  ExpectBadValue("metadata_store", "sqlite://granary.db", "'sqlite://granary.db'",
                 "not an absolute SQLite path");
  ExpectBadValue("metadata_store", "sqlite:granary.db", "'sqlite:granary.db'",
                 "not an absolute SQLite path");
  ExpectBadValue("metadata_store", "sqlite:///", "'sqlite:///'", "names no database file");
  ExpectBadValue("metadata_store", "'redis://host name'", "'redis://host name'", "space");
  ExpectBadValue("metadata_store", "''", "''", kBoth);
}

TEST(CacheNodeConfigTest, BadCounts) {
  struct Range {
    const char* key;
    const char* too_big;
    const char* range;
  };
  for (const Range& r : {Range{"source_concurrency", "1025", "write 1 to 1024"},
                         Range{"worker_threads", "65", "write 1 to 64"},
                         Range{"service_threads", "257", "write 1 to 256"},
                         Range{"max_connections", "65537", "write 1 to 65536"},
                         Range{"scan_threads", "65", "write 1 to 64"}}) {
    ExpectBadValue(r.key, "0", "0 is out of range", r.range);
    ExpectBadValue(r.key, r.too_big, std::string(r.too_big) + " is out of range", r.range);
    ExpectBadValue(r.key, "-1", "'-1'", "not a whole number");
    ExpectBadValue(r.key, "1.5", "'1.5'", "not a whole number");
    ExpectBadValue(r.key, "many", "'many'", "not a whole number");
    ExpectBadValue(r.key, "'8 '", "'8 '", "not a whole number");
    ExpectBadValue(r.key, "4294967296", "'4294967296'", "out of range");
    ExpectBadValue(r.key, "[4]", "expected a single value", "not a list or map");
  }
}

TEST(CacheNodeConfigTest, BadDurations) {
  for (const char* key :
       {"heartbeat_interval", "heartbeat_ttl", "drain_timeout", "startup_timeout", "write_timeout",
        "reply_stall_timeout", "progress_refresh_interval", "cache_idle_after"}) {
    ExpectBadValue(key, "0s", "0s is not a positive duration", "e.g. 250ms");
    ExpectBadValue(key, "0", "0s is not a positive duration", "e.g. 250ms");
    for (const char* bad : {"-1s", "5 parsecs", "fast", "2d", "1.2.3s"}) {
      ExpectBadValue(key, bad, bad, "duration");
    }
    ExpectBadValue(key, "[1s]", "expected a single value", "not a list or map");
  }
  ExpectBadValue("heartbeat_ttl", "25h", "90000s is out of range", "write 10ms to 86400s");
}

TEST(CacheNodeConfigTest, TtlMustExceedTwiceTheInterval) {
  // The default interval is 2s.
  ExpectBadValue("heartbeat_ttl", "4s",
                 "'heartbeat_ttl' (4s) must exceed twice 'heartbeat_interval' (2s, the default)",
                 "write a heartbeat_ttl above 4s");
  ExpectBadValue("heartbeat_ttl", "1s", "(1s) must exceed twice",
                 "or a shorter heartbeat_interval");
  EXPECT_OK(ParseCacheNodeConfig(With("heartbeat_ttl", "4001ms"), "node.yaml"));
  // Only the interval written: it is blamed, and the TTL is the default 10s.
  ExpectBadValue("heartbeat_interval", "5s",
                 "'heartbeat_ttl' (10s, the default) must exceed twice 'heartbeat_interval' (5s)",
                 "above 10s");
  EXPECT_OK(ParseCacheNodeConfig(With("heartbeat_interval", "4999ms"), "node.yaml"));
  // Both written: the TTL's line is named.
  std::string text = With("heartbeat_interval", "1m") + "heartbeat_ttl: 2m\n";
  ExpectError(text, {"node.yaml:5: key 'heartbeat_ttl'", "(120s) must exceed twice",
                     "'heartbeat_interval' (60s)"});
}

TEST(CacheNodeConfigTest, VerifyReads) {
  Result<CacheNodeConfig> c = ParseCacheNodeConfig(With("node_id", "n1"), "node.yaml");
  ASSERT_OK(c);
  EXPECT_FALSE(c->verify_reads_once) << "the default checks every read";
  c = ParseCacheNodeConfig(With("verify_reads", "once"), "node.yaml");
  ASSERT_OK(c);
  EXPECT_TRUE(c->verify_reads_once);
  c = ParseCacheNodeConfig(With("verify_reads", "always"), "node.yaml");
  ASSERT_OK(c);
  EXPECT_FALSE(c->verify_reads_once);
  for (const char* bad : {"never", "Once", "''", "true"}) {
    ExpectBadValue("verify_reads", bad, "is not a choice", "write always");
  }
}

TEST(CacheNodeConfigTest, BadLogLevelAndScanMode) {
  for (const char* bad : {"loud", "INFO", "warning", "''", "critical"}) {
    ExpectBadValue("log_level", bad, "is not a log level", "trace, debug, info, warn, error, off");
  }
  ExpectBadValue("log_level", "[info]", "expected a single value", "not a list or map");
  for (const char* bad : {"full", "Verify", "''", "presence,verify"}) {
    ExpectBadValue("scan_mode", bad, "is not a scan mode", "write presence");
  }
  ExpectBadValue("scan_mode", "loud", "'loud'", "or verify");
}

TEST(CacheNodeConfigTest, CachePolicyAndIdleTime) {
  auto c =
      ParseCacheNodeConfig(With("cache_policy", "lru") + "cache_idle_after: 90s\n", "node.yaml");
  ASSERT_OK(c);
  EXPECT_TRUE(c->cache_lru);
  EXPECT_EQ(c->cache_idle_after, std::chrono::seconds(90));
  auto d = ParseCacheNodeConfig(With("cache_policy", "resident"), "node.yaml");
  ASSERT_OK(d);
  EXPECT_FALSE(d->cache_lru);
  EXPECT_EQ(d->cache_idle_after, std::chrono::minutes(10));
  for (const char* bad : {"LRU", "lfu", "''", "resident,lru", "1"}) {
    ExpectBadValue("cache_policy", bad, "is not a cache policy", "write resident");
  }
  ExpectBadValue("cache_policy", "[lru]", "expected a single value", "not a list or map");
}

TEST(CacheNodeConfigTest, UnknownKeys) {
  ExpectError(With("capacty", "1GiB"),
              {"node.yaml:4: unknown key 'capacty'", "did you mean 'capacity'?"});
  ExpectError(With("worker_thread", "4"),
              {"node.yaml:4: unknown key 'worker_thread'", "did you mean 'worker_threads'?"});
  ExpectError(With("colour", "blue"), {"node.yaml:4: unknown key 'colour'",
                                       "known keys:", "data_dir", "metadata_store", "scan_mode"});
  // Keys are case-sensitive, and a section where none is expected is unknown too.
  ExpectError(With("Pool", "default"), {"unknown key 'Pool'", "did you mean 'pool'?"});
  ExpectError(With("metrics", "{listen: 127.0.0.1:9464}"), {"unknown key 'metrics'"});
}

TEST(CacheNodeConfigTest, MissingRequiredKeys) {
  for (const auto& [key, value] : kRequired) {
    SCOPED_TRACE(key);
    ExpectError(With(key, nullptr), {"node.yaml", "missing required key '" + key + "'"});
    // A key with no value is missing too.
    ExpectError(With(key, ""), {"missing required key '" + key + "'"});
  }
}

TEST(CacheNodeConfigTest, EmptyBrokenAndNonMappingDocuments) {
  ExpectError("", {"node.yaml", "missing required key 'data_dir'"});
  ExpectError("# nothing but a comment\n\n", {"missing required key 'data_dir'"});
  ExpectError("- data_dir\n- capacity\n", {"node.yaml", "top level must be a mapping"});
  ExpectError("just a string\n", {"node.yaml", "top level must be a mapping"});
  ExpectError("42\n", {"top level must be a mapping"});
  ExpectError("data_dir: [unclosed\n", {"node.yaml:", "not valid YAML"});
  ExpectError("data_dir: /a\n  capacity: 1GiB\n", {"node.yaml:", "not valid YAML"});
  ExpectError("\tdata_dir: /a\n", {"node.yaml"});
  ExpectError(std::string("\xff\xfe\0\x01garbage: [", 13), {"node.yaml"});
}

TEST(CacheNodeConfigTest, LoadNamesTheFileInEveryError) {
  testing::TempDir dir;
  dir.WriteFile("good.yaml", With("", nullptr));
  EXPECT_OK(LoadCacheNodeConfig(dir.Join("good.yaml")));
  dir.WriteFile("bad.yaml", With("worker_threads", "0"));
  Result<CacheNodeConfig> c = LoadCacheNodeConfig(dir.Join("bad.yaml"));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find(dir.Join("bad.yaml") + ":4: key 'worker_threads'"),
            std::string::npos)
      << c.status().ToString();

  c = LoadCacheNodeConfig(dir.Join("missing.yaml"));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find(dir.Join("missing.yaml")), std::string::npos);
  EXPECT_NE(c.status().message().find("--config"), std::string::npos) << c.status().ToString();

  c = LoadCacheNodeConfig(dir.path());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("is a directory"), std::string::npos)
      << c.status().ToString();
  EXPECT_NE(c.status().message().find(dir.path()), std::string::npos);

  c = LoadCacheNodeConfig("/dev/null");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("not a regular file"), std::string::npos)
      << c.status().ToString();

  c = LoadCacheNodeConfig("");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound) << c.status().ToString();
}

TEST(CacheNodeConfigTest, AnUnreadableFileIsPermissionDenied) {
  testing::TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  const std::string path = dir.Join("secret.yaml");
  dir.WriteFile("secret.yaml", With("", nullptr));
  ASSERT_EQ(::chmod(path.c_str(), 0000), 0);
  auto check = [&path]() -> int {
    Result<CacheNodeConfig> c = LoadCacheNodeConfig(path);
    if (c.ok()) return 2;
    if (c.status().code() != StatusCode::kPermissionDenied) return 3;
    if (c.status().message().find(path) == std::string::npos) return 4;
    if (c.status().message().find("readable") == std::string::npos) return 5;
    return 0;
  };
  if (::geteuid() != 0) {
    EXPECT_EQ(check(), 0);
    return;
  }
  // Root reads any file: check as an unprivileged user in a child process.
  auto child = testing::ChildProcess::Start([&check](int) -> int {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) return 10;
    return check();
  });
  ASSERT_OK(child);
  Result<int> code = (*child)->Wait(std::chrono::seconds(10));
  ASSERT_OK(code);
  EXPECT_EQ(*code, 0) << "2: read it; 3: wrong code; 4: no path; 5: no hint; 10: setuid failed";
}

TEST(CacheNodeConfigTest, ScanModeNames) {
  EXPECT_EQ(ChunkScanModeName(ChunkScanMode::kPresence), "presence");
  EXPECT_EQ(ChunkScanModeName(ChunkScanMode::kVerifyPayload), "verify");
}

// Secure by default: what may serve without authentication, and what each
// refusal says.
TEST(CacheNodeConfigTest, WithoutAuthenticationOnlyTheExplicitOptOutOnLoopbackServes) {
  auto check = [](const std::string& extra) {
    SCOPED_TRACE(extra);
    Result<CacheNodeConfig> c = ParseCacheNodeConfig(With("zz", nullptr) + extra, "node.yaml");
    EXPECT_OK(c);
    return c.ok() ? CheckCacheNodeAuthentication(*c, "node.yaml")
                  : Status::Internal("did not parse");
  };
  // Neither key nor Kubernetes auth nor opt-out: refused, with every way out.
  for (const std::string& extra : {std::string(), std::string("listen: 127.0.0.1:7070\n"),
                                   std::string("unsafe_serve_without_authentication_beyond_"
                                               "loopback: true\n")}) {
    Status s = check(extra);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << extra << s.ToString();
    for (const char* part : {"node.yaml: no authentication", "granary cluster-key generate",
                             "cluster_key_file: /etc/granary/cluster.key", "kubernetes_auth",
                             "serve_without_authentication: true"}) {
      EXPECT_NE(s.message().find(part), std::string::npos) << part << " not in " << s.message();
    }
  }
  // A key, or Kubernetes auth: fine anywhere.
  EXPECT_OK(check("cluster_key_file: /etc/granary/cluster.key\n"));
  EXPECT_OK(check("kubernetes_auth: in-cluster\n"));
  // The opt-out: loopback only.
  for (const char* host : {"127.0.0.1", "127.3.4.5", "localhost", "[::1]"}) {
    SCOPED_TRACE(host);
    EXPECT_OK(
        check("serve_without_authentication: true\nlisten: \"" + std::string(host) + ":7070\"\n"));
  }
  for (const char* listen :
       {"0.0.0.0:7070", "[::]:7070", "10.1.2.3:7070", "gpu-7:7070", "128.0.0.1:7070"}) {
    Status s =
        check("serve_without_authentication: true\nlisten: \"" + std::string(listen) + "\"\n");
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << listen;
    EXPECT_NE(s.message().find("which is not loopback only"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("unsafe_serve_without_authentication_beyond_loopback: true"),
              std::string::npos)
        << s.message();
  }
  // A fabric address beyond loopback counts too.
  Status fabric = check(
      "serve_without_authentication: true\nlisten: 127.0.0.1:7070\nfabric_listen: "
      "0.0.0.0:7071\n");
  EXPECT_EQ(fabric.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(fabric.message().find("0.0.0.0:7071"), std::string::npos) << fabric.message();
  // Both options: anywhere.
  EXPECT_OK(
      check("serve_without_authentication: true\nunsafe_serve_without_authentication_beyond_"
            "loopback: true\nlisten: 0.0.0.0:7070\n"));
  // Bad values are parse errors naming the key.
  ExpectBadValue("serve_without_authentication", "yes please", "yes please", "true or false");
  ExpectBadValue("unsafe_serve_without_authentication_beyond_loopback", "1x", "1x",
                 "true or false");
}

TEST(CacheNodeConfigTest, LoopbackHosts) {
  for (const char* host : {"127.0.0.1", "127.255.255.254", "::1", "localhost"}) {
    EXPECT_TRUE(IsLoopbackHost(host)) << host;
  }
  for (const char* host : {"0.0.0.0", "::", "10.0.0.1", "128.0.0.1", "127.0.0", "localhost.",
                           "127.0.0.1.example", "", "::2"}) {
    EXPECT_FALSE(IsLoopbackHost(host)) << host;
  }
}

}  // namespace
}  // namespace granary

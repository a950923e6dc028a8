// The sidecar's YAML configuration: defaults, every key, and the bad values
// each get a message naming the key and what to write.

#include "granary/config/sidecar_config.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include "testing/test_util.h"

namespace granary::sidecar {
namespace {

Result<SidecarConfig> Parse(const std::string& yaml) { return ParseSidecarConfig(yaml, "t.yaml"); }

TEST(SidecarConfigTest, DefaultsAndEnvironmentSocket) {
  ::unsetenv("GRANARY_SOCKET");
  auto c = Parse("metadata_store: sqlite:///tmp/g.db\nlocal_node: gpu-1\n");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->socket_path, kDefaultSocketPath);
  EXPECT_EQ(c->socket_mode, 0660u);
  EXPECT_EQ(c->arena_bytes, c->window_bytes + (64ull << 20));
  EXPECT_EQ(c->local_node, "gpu-1");
  EXPECT_EQ(c->max_clients, 256u);
  EXPECT_EQ(c->max_clients_per_uid, 64u) << "max_clients / 4";
  EXPECT_EQ(c->idle_timeout, std::chrono::minutes(30));
  c = Parse("metadata_store: redis://h\nmax_clients: 2\n");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->max_clients_per_uid, 1u) << "at least one";
  ::setenv("GRANARY_SOCKET", "/tmp/x/g.sock", 1);
  c = Parse("metadata_store: redis://127.0.0.1:6379\n");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->socket_path, "/tmp/x/g.sock");
  c = Parse("metadata_store: redis://h\nsocket: /run/s.sock\n");
  EXPECT_EQ(c->socket_path, "/run/s.sock") << "the config wins over the environment";
  ::unsetenv("GRANARY_SOCKET");
}

TEST(SidecarConfigTest, EveryKey) {
  auto c = Parse(
      "socket: /run/g/s.sock\nsocket_mode: \"0600\"\nmetadata_store: redis://h:1/2\npool: a100\n"
      "local_node: n1\nlocal_node_socket: /run/g/node.sock\nwindow_samples: 10\nwindow_bytes: "
      "8MiB\narena_bytes: 64MiB\n"
      "fetch_threads: 3\nfetch_batch: 7\nsource_fallthrough: false\nsource_concurrency: 2\n"
      "max_clients: 9\nmetrics_listen: 127.0.0.1:0\nrefresh_interval: 2s\nconnect_timeout: 1s\n"
      "call_timeout: 5s\nnode_down_for: 4s\nwait_timeout: 9s\nstartup_timeout: 3s\n"
      "log_level: debug\nmax_clients_per_uid: 5\nidle_timeout: 90s\n");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->max_clients_per_uid, 5u);
  EXPECT_EQ(c->idle_timeout, std::chrono::seconds(90));
  EXPECT_EQ(c->socket_mode, 0600u);
  EXPECT_EQ(c->window_bytes, 8ull << 20);
  EXPECT_EQ(c->arena_bytes, 64ull << 20);
  EXPECT_FALSE(c->source_fallthrough);
  EXPECT_EQ(c->fetch_batch, 7u);
  EXPECT_EQ(c->wait_timeout, std::chrono::seconds(9));
  EXPECT_EQ(c->local_node_socket, "/run/g/node.sock");
  auto m = Parse("metadata_store: redis://h\nmounts: a:/mnt/a,b-2:/mnt/b\n");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->mounts.size(), 2u);
  EXPECT_EQ(m->mounts[1].dataset, "b-2");
  EXPECT_EQ(m->mounts[1].dir, "/mnt/b");
  EXPECT_FALSE(m->datasets.has_value()) << "unset: every dataset of the pool";
  auto d = Parse("metadata_store: redis://h\nmounts: a:/mnt/a\ndatasets: a,b-2,a\n");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->datasets, (std::vector<std::string>{"a", "b-2"}));
  d = Parse("metadata_store: redis://h\ndatasets: \"\"\n");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->datasets, std::vector<std::string>{}) << "empty: none";
}

TEST(SidecarConfigTest, BadValuesNameTheKey) {
  struct Case {
    std::string yaml;
    std::string key;
  };
  const std::string store = "metadata_store: redis://h\n";
  const std::vector<Case> cases = {
      {"pool: x\n", "metadata_store"},
      {store + "socket: relative.sock\n", "socket"},
      {store + "socket: /" + std::string(200, 'a') + "\n", "socket"},
      {store + "socket_mode: \"0666\"\n", "socket_mode"},
      {store + "socket_mode: \"0400\"\n", "socket_mode"},
      {store + "socket_mode: rw\n", "socket_mode"},
      {"metadata_store: mysql://x\n", "metadata_store"},
      {store + "pool: Bad_Pool\n", "pool"},
      {store + "local_node: \"-x\"\n", "local_node"},
      {store + "local_node_socket: node.sock\n", "local_node_socket"},
      {store + "mounts: imagenet\n", "mounts"},
      {store + "mounts: Bad_Name:/mnt/x\n", "mounts"},
      {store + "mounts: imagenet:mnt\n", "mounts"},
      {store + "mounts: a:/mnt/x,b:/mnt/x\n", "mounts"},
      {store + "datasets: Bad_Name\n", "datasets"},
      {store + "datasets: a,,b\n", "datasets"},
      {store + "datasets: a\nmounts: b:/mnt/b\n", "mounts dataset 'b', which is not among"},
      {store + "local_node_socket: /" + std::string(200, 'b') + "\n", "local_node_socket"},
      {store + "window_samples: 0\n", "window_samples"},
      {store + "window_bytes: 10\n", "window_bytes"},
      {store + "window_bytes: 64MiB\narena_bytes: 65MiB\n", "arena_bytes"},
      {store + "fetch_threads: 0\n", "fetch_threads"},
      {store + "refresh_interval: 0s\n", "refresh_interval"},
      {store + "idle_timeout: 0s\n", "idle_timeout"},
      {store + "max_clients_per_uid: 0\n", "max_clients_per_uid"},
      {store + "max_clients: 8\nmax_clients_per_uid: 9\n", "max_clients_per_uid"},
      {store + "log_level: loud\n", "log_level"},
      {store + "windw_bytes: 1MiB\n", "windw_bytes"},
      {store + "transport: rdma\n", "transport"},
      {store + "libfabric_provider: verbs\n", "without 'transport: libfabric'"},
      {store + "transport: libfabric\nlibfabric_provider: \"tcp;ofi_rxm x\"\n",
       "not a provider name"},
  };
  for (const Case& c : cases) {
    auto got = Parse(c.yaml);
    ASSERT_FALSE(got.ok()) << c.yaml;
    EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument) << c.yaml;
    EXPECT_NE(got.status().message().find(c.key), std::string::npos)
        << c.yaml << " -> " << got.status().message();
  }
  EXPECT_FALSE(LoadSidecarConfig("/nonexistent/sidecar.yaml").ok());
}

TEST(SidecarConfigTest, TransportDefaultsToTcpAndTakesLibfabricWithAProvider) {
  Result<SidecarConfig> c = Parse("metadata_store: redis://h\n");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->transport, "tcp");
  c = Parse("metadata_store: redis://h\ntransport: libfabric\nlibfabric_provider: verbs\n");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->transport, "libfabric");
  EXPECT_EQ(c->libfabric_provider, "verbs");
}

TEST(SidecarConfigTest, StoreUrlFromAFile) {
  granary::testing::TempDir dir;
  dir.WriteFile("url", "redis://10.0.0.2:6379/1\n");
  dir.WriteFile("bad-url", "mysql://x\n");
  const auto load = [&](const std::string& yaml) {
    dir.WriteFile("sidecar.yaml", yaml);
    return LoadSidecarConfig(dir.Join("sidecar.yaml"));
  };
  Result<SidecarConfig> c = load("metadata_store_file: " + dir.Join("url") + "\n");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->metadata_store, "redis://10.0.0.2:6379/1") << "the newline is dropped";

  struct Case {
    std::string yaml;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"metadata_store_file: " + dir.Join("url") + "\nmetadata_store: redis://h\n", "not both"},
      {"metadata_store_file: url\n", "not an absolute path"},
      {"metadata_store_file: " + dir.Join("missing") + "\n", "mount the file"},
      {"metadata_store_file: " + dir.Join("bad-url") + "\n", "does not hold a store URL"},
  };
  for (const Case& bad : cases) {
    Result<SidecarConfig> got = load(bad.yaml);
    ASSERT_FALSE(got.ok()) << bad.yaml;
    EXPECT_NE(got.status().message().find(bad.says), std::string::npos)
        << bad.yaml << " -> " << got.status().message();
    EXPECT_NE(got.status().message().find("metadata_store_file"), std::string::npos)
        << got.status().message();
  }
}

}  // namespace
}  // namespace granary::sidecar

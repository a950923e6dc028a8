#pragma once

// RedisSentinelSet: a replicated Redis under Redis Sentinel for tests, all on
// 127.0.0.1 free ports: a primary and `replicas` replicas (RedisServer, each
// with its own directory, append-only with fsync always), and `sentinels`
// sentinels (redis-server --sentinel with a config file of their own)
// monitoring them as master `granary` with quorum 2, a node counted down
// after 1 s and a failover timeout of 5 s, so a killed primary is replaced
// within a few seconds.
//
// Start() returns once every sentinel knows every replica and the other
// sentinels (a failover needs both). Every wait is bounded; the destructor
// kills everything and removes the directories.
//
// Thread safety: one test thread owns it.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "granary/core/status.h"
#include "testing/redis_server.h"
#include "testing/test_util.h"

namespace granary::testing {

struct RedisSentinelOptions {
  int replicas = 1;
  int sentinels = 3;
  std::string master_name = "granary";
  // requirepass (and masterauth) of the data servers; empty: none.
  std::string password;
  // requirepass of the sentinels; empty: none.
  std::string sentinel_password;
};

class RedisSentinelSet {
 public:
  static Result<std::unique_ptr<RedisSentinelSet>> Start(RedisSentinelOptions options = {});
  ~RedisSentinelSet();
  RedisSentinelSet(const RedisSentinelSet&) = delete;
  RedisSentinelSet& operator=(const RedisSentinelSet&) = delete;

  // redis+sentinel://[:password@]127.0.0.1:p1,127.0.0.1:p2,.../<master>/0
  // followed by `query` (e.g. "?retry_ms=20000").
  std::string url(const std::string& query = "") const;
  std::vector<uint16_t> sentinel_ports() const;
  const RedisSentinelOptions& options() const { return options_; }

  // The server that is the primary now, as the sentinels report it; and the
  // data servers (index 0 was the first primary).
  Result<uint16_t> PrimaryPort() const;
  RedisServer& server(size_t i) { return *servers_[i]; }
  size_t server_count() const { return servers_.size(); }
  // The data server listening on `port`; null if none.
  RedisServer* ServerOnPort(uint16_t port);

  // Waits until every replica has acknowledged everything the primary wrote
  // (INFO replication offsets), so a failover now loses no write.
  Status WaitReplicated(std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;
  // Kills the primary (SIGKILL) and waits until the sentinels report another
  // one that answers as primary. Returns its port.
  Result<uint16_t> KillPrimaryAndWaitForFailover(
      std::chrono::milliseconds timeout = std::chrono::seconds(30));

  // The sentinels' logs' tails, for failure messages.
  std::string LogTails() const;

 private:
  explicit RedisSentinelSet(RedisSentinelOptions options);
  Status StartSentinel(uint16_t primary_port);
  Status WaitDiscovered(std::chrono::milliseconds timeout) const;

  struct Sentinel;
  RedisSentinelOptions options_;
  TempDir dir_;
  std::vector<std::unique_ptr<RedisServer>> servers_;
  std::vector<std::unique_ptr<Sentinel>> sentinels_;
};

}  // namespace granary::testing

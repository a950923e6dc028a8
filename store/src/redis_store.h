#pragma once

// RedisStore: the MetadataStore backend for a cluster, over hiredis (blocking
// API, one connection per store and one per watcher). Key schema, scripts and
// failure behaviour: docs/metadata-store.md.
//
// Made only by OpenMetadataStore. What it implements are RecordStore's storage
// primitives; the records' validation, encoding and errors are RecordStore's.
// Thread safety: as MetadataStore says; RecordStore holds its mutex around
// every primitive, retries and backoff included.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "granary/core/metadata_store.h"
#include "record_store.h"

struct redisContext;
struct redisReply;

namespace granary {

struct RedisAddress {
  std::string host;
  uint16_t port = 0;
};

struct RedisConfig {
  std::string host;  // the server; with sentinels, found through them on each connect
  uint16_t port = 6379;
  // redis+sentinel://: the sentinels asked for the primary of `master_name`
  // (SENTINEL get-master-addr-by-name), in this order, on every (re)connect;
  // the server found must say it is a primary (ROLE). Empty: `host` as it is.
  std::vector<RedisAddress> sentinels;
  std::string master_name;
  std::string sentinel_password;  // AUTH to the sentinels; empty: none
  int db = 0;
  std::string user;      // empty: AUTH with the password alone
  std::string password;  // empty: no AUTH
  std::string prefix = "granary";
  std::string display_url;  // the URL with the password redacted
  std::chrono::milliseconds connect_timeout{2000};
  std::chrono::milliseconds retry_budget{5000};
  Clock* clock = nullptr;  // never null once OpenMetadataStore has filled it in
};

namespace redis_internal {
struct ContextDeleter {
  void operator()(redisContext* c) const;
};
struct ReplyDeleter {
  void operator()(redisReply* r) const;
};
using ContextPtr = std::unique_ptr<redisContext, ContextDeleter>;
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;
}  // namespace redis_internal

class RedisStore final : public store_internal::RecordStore {
 public:
  // Connects once (no retry) and checks the server answers.
  static Result<std::unique_ptr<MetadataStore>> Open(RedisConfig config);
  ~RedisStore() override;

  const std::string& url() const override { return config_.display_url; }
  Result<std::unique_ptr<Watcher>> Watch() override;

 private:
  explicit RedisStore(RedisConfig config);

  // The storage primitives (record_store.h), one script or command each.
  Result<bool> InsertDataset(std::string_view what, std::string_view name, int64_t created_ms,
                             const std::string& record, const Event& event) override;
  Result<std::optional<DatasetRow>> ReadDataset(std::string_view what,
                                                std::string_view name) override;
  Status ReadDatasets(std::string_view what,
                      const std::function<Status(const DatasetRow&)>& each) override;
  Result<DatasetSwap> SwapDataset(std::string_view what, std::string_view name,
                                  uint64_t expected_revision, uint64_t new_revision,
                                  const std::string& record, const Event& event) override;
  Result<bool> EraseDataset(std::string_view what, std::string_view name,
                            const Event& event) override;
  Status WriteManifest(std::string_view what, std::string_view manifest_id,
                       std::string_view bytes) override;
  Result<std::optional<std::string>> ReadManifest(std::string_view what,
                                                  std::string_view manifest_id) override;
  Status WriteNode(std::string_view what, const NodeRecord& node, const std::string& identity,
                   const std::string& record, int64_t now_ms, std::chrono::milliseconds ttl,
                   const Event& event) override;
  Status ReadNodes(std::string_view what, std::string_view pool,
                   const std::function<Status(const NodeRow&)>& each) override;
  Result<bool> EraseNode(std::string_view what, std::string_view node_id,
                         const Event& event) override;
  Result<uint64_t> ReadNodesVersion(std::string_view what) override;
  Result<bool> WriteChild(std::string_view what, RecordKind kind, std::string_view dataset,
                          std::string_view key, const std::string& record,
                          const Event& event) override;
  Result<std::optional<std::map<std::string, std::string>>> ReadChildren(
      std::string_view what, RecordKind kind, std::string_view dataset) override;
  Result<PlanErase> ErasePlan(std::string_view what, std::string_view dataset,
                              std::string_view plan_id, const Event& event) override;
  // "key 'granary:dataset:x'", "field 'n1' of key 'granary:progress:x'".
  std::string Location(RecordKind kind, std::string_view name, std::string_view key) const override;

  // Key names (docs/metadata-store.md, "Redis key schema").
  std::string Key(std::string_view kind, std::string_view name) const;
  std::string Channel() const;
  // A dataset from the fields of its hash: revision and created_ms are decimal
  // text beside the JSON record.
  Result<DatasetRow> DatasetFromHash(std::string_view name, std::string_view revision_text,
                                     std::string_view created_text, std::string_view record) const;

  // Runs one command, reconnecting and retrying on connection errors and on
  // transient server errors (LOADING, BUSY, ...) until the retry budget is
  // spent. A server error reply that is not transient is returned as a Status.
  // `what` says what the caller was doing, for messages. Called only from the
  // primitives, so with RecordStore's mutex held, which guards the members
  // below.
  Result<redis_internal::ReplyPtr> Command(std::string_view what,
                                           const std::vector<std::string>& args);
  // EVAL of `script` with `keys` and `argv`.
  Result<redis_internal::ReplyPtr> Eval(std::string_view what, std::string_view script,
                                        const std::vector<std::string>& keys,
                                        const std::vector<std::string>& argv);

  const RedisConfig config_;
  redis_internal::ContextPtr context_;  // null while disconnected
  // Connections made: part of NodesVersion, so a reader re-lists after a
  // reconnect (a restarted store or a failover may have lost increments of
  // the counter, which could then come back to a value a reader saw).
  uint64_t connections_ = 1;
  bool degraded_ = false;  // warned about the current outage
};

// Connects, authenticates and selects the database; kUnavailable naming the URL
// on failure. Shared with the watcher.
Result<redis_internal::ContextPtr> RedisConnect(const RedisConfig& config,
                                                std::chrono::milliseconds timeout);

}  // namespace granary

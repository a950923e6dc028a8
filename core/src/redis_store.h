#pragma once

// RedisStore: the MetadataStore backend for a cluster, over hiredis (blocking
// API, one connection per store and one per watcher). Key schema, scripts and
// failure behaviour: docs/metadata-store.md.
//
// Made only by OpenMetadataStore. Thread safety: as MetadataStore says; every
// call holds mu_ for its whole duration, retries and backoff included.

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "granary/core/metadata_store.h"

struct redisContext;
struct redisReply;

namespace granary {

struct RedisConfig {
  std::string host;
  uint16_t port = 6379;
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

class RedisStore final : public MetadataStore {
 public:
  // Connects once (no retry) and checks the server answers.
  static Result<std::unique_ptr<MetadataStore>> Open(RedisConfig config);
  ~RedisStore() override;

  const std::string& url() const override { return config_.display_url; }

  Result<DatasetRecord> CreateDataset(const DatasetRecord& record) override;
  Result<DatasetRecord> GetDataset(std::string_view name) override;
  Result<std::vector<DatasetRecord>> ListDatasets() override;
  Result<DatasetRecord> UpdateDataset(const DatasetRecord& record) override;
  Status DeleteDataset(std::string_view name) override;

  Status PutManifest(std::string_view manifest_id, std::string_view bytes) override;
  Result<std::string> GetManifest(std::string_view manifest_id) override;

  Status Heartbeat(const NodeRecord& node, std::chrono::milliseconds ttl) override;
  Result<std::vector<NodeRecord>> ListNodes(std::string_view pool) override;
  Status RemoveNode(std::string_view node_id) override;

  Status PutProgress(std::string_view dataset, std::string_view node_id,
                     const StagingProgress& progress) override;
  Result<std::map<std::string, StagingProgress>> ListProgress(std::string_view dataset) override;

  Status PutPlan(std::string_view dataset, const PlanRecord& plan) override;
  Result<std::vector<PlanRecord>> ListPlans(std::string_view dataset) override;
  Status DeletePlan(std::string_view dataset, std::string_view plan_id) override;

  Result<std::unique_ptr<Watcher>> Watch() override;

 private:
  explicit RedisStore(RedisConfig config);

  // Key names (docs/metadata-store.md, "Redis key schema").
  std::string Key(std::string_view kind, std::string_view name) const;
  std::string Channel() const;
  // Where a record was read from, for kCorruption messages: "dataset 'x' (key
  // 'granary:dataset:x') in redis://..." and the same for a hash field.
  std::string RecordWhere(std::string_view kind, std::string_view name, std::string_view key) const;
  std::string FieldWhere(std::string_view record, std::string_view field,
                         std::string_view key) const;

  // Runs one command, reconnecting and retrying on connection errors and on
  // transient server errors (LOADING, BUSY, ...) until the retry budget is
  // spent. A server error reply that is not transient is returned as a Status.
  // `what` says what the caller was doing, for messages.
  Result<redis_internal::ReplyPtr> Command(std::string_view what,
                                           const std::vector<std::string>& args);
  // EVAL of `script` with `keys` and `argv`.
  Result<redis_internal::ReplyPtr> Eval(std::string_view what, std::string_view script,
                                        const std::vector<std::string>& keys,
                                        const std::vector<std::string>& argv);
  // The progress or plans hash of `dataset` (hash_kind "progress" or "plans"):
  // field -> JSON, or kNotFound if the dataset does not exist; and a put of
  // one field, refused the same way. One script each, so the existence check
  // and the access are atomic.
  Result<std::map<std::string, std::string>> ListChildren(std::string_view what,
                                                          std::string_view dataset,
                                                          std::string_view hash_kind);
  Status PutChild(std::string_view what, std::string_view dataset, std::string_view hash_kind,
                  std::string_view field, const std::string& json, EventKind event);

  const RedisConfig config_;
  std::mutex mu_;
  redis_internal::ContextPtr context_;  // guarded by mu_; null while disconnected
  bool degraded_ = false;               // guarded by mu_; warned about the current outage
};

// Connects, authenticates and selects the database; kUnavailable naming the URL
// on failure. Shared with the watcher.
Result<redis_internal::ContextPtr> RedisConnect(const RedisConfig& config,
                                                std::chrono::milliseconds timeout);

}  // namespace granary

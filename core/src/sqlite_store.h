#pragma once

// SqliteStore: the embedded MetadataStore backend, one SQLite file in WAL mode
// that several processes on one host may share. Tables and failure behaviour:
// docs/metadata-store.md.
//
// Made only by OpenMetadataStore. Thread safety: as MetadataStore says; every
// call holds mu_ on the store's one connection. Other processes are kept apart
// by SQLite's file locks; writers wait up to the busy timeout (retry_budget).

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "granary/core/metadata_store.h"

struct sqlite3;

namespace granary {

struct SqliteConfig {
  std::string path;                              // absolute
  std::string display_url;                       // sqlite:///path
  std::chrono::milliseconds retry_budget{5000};  // the busy timeout
  std::chrono::milliseconds poll_interval{100};  // watchers
  uint32_t event_rows = 10000;
  Clock* clock = nullptr;  // never null once OpenMetadataStore has filled it in
};

namespace sqlite_internal {
struct DbDeleter {
  void operator()(sqlite3* db) const;
};
using DbPtr = std::unique_ptr<sqlite3, DbDeleter>;
struct ChildTable;  // progress or plans (sqlite_store.cc)
}  // namespace sqlite_internal

class SqliteStore final : public MetadataStore {
 public:
  // Opens or creates the file and its schema.
  static Result<std::unique_ptr<MetadataStore>> Open(SqliteConfig config);
  ~SqliteStore() override;

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
  SqliteStore(SqliteConfig config, sqlite_internal::DbPtr db);

  // The shape PutProgress/PutPlan and ListProgress/ListPlans share: a row of
  // `table` for (dataset, key), written or listed only if the dataset exists
  // (kNotFound otherwise), in one transaction with the existence check.
  Status PutChild(std::string_view what, const sqlite_internal::ChildTable& table,
                  std::string_view dataset, std::string_view key, const std::string& json,
                  EventKind event);
  // key -> JSON record.
  Result<std::map<std::string, std::string>> ListChildren(std::string_view what,
                                                          const sqlite_internal::ChildTable& table,
                                                          std::string_view dataset);
  // Where a child record was read from, for kCorruption messages.
  std::string RowWhere(std::string_view record, const sqlite_internal::ChildTable& table,
                       std::string_view dataset, std::string_view key) const;

  const SqliteConfig config_;
  std::mutex mu_;
  sqlite_internal::DbPtr db_;  // guarded by mu_
};

}  // namespace granary

#pragma once

// SqliteStore: the embedded MetadataStore backend, one SQLite file in WAL mode
// that several processes on one host may share. Tables and failure behaviour:
// docs/metadata-store.md.
//
// Made only by OpenMetadataStore. What it implements are RecordStore's storage
// primitives; the records' validation, encoding and errors are RecordStore's.
// Thread safety: as MetadataStore says; RecordStore holds its mutex around
// every primitive on the store's one connection. Other processes are kept
// apart by SQLite's file locks; writers wait up to the busy timeout
// (retry_budget).

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "granary/core/metadata_store.h"
#include "record_store.h"

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
}  // namespace sqlite_internal

class SqliteStore final : public store_internal::RecordStore {
 public:
  // Opens or creates the file and its schema.
  static Result<std::unique_ptr<MetadataStore>> Open(SqliteConfig config);
  ~SqliteStore() override;

  const std::string& url() const override { return config_.display_url; }
  Result<std::unique_ptr<Watcher>> Watch() override;

 private:
  SqliteStore(SqliteConfig config, sqlite_internal::DbPtr db);

  // The storage primitives (record_store.h), one transaction or statement
  // each; a write inserts its event row in the same transaction.
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
  // "row of table datasets", "row 'ds', 'n1' of table progress".
  std::string Location(RecordKind kind, std::string_view name, std::string_view key) const override;

  // A dataset from its row: revision and created_ms are columns beside the JSON.
  Result<DatasetRow> DatasetFromRow(std::string name, int64_t revision, int64_t created_ms,
                                    std::string record) const;

  const SqliteConfig config_;
  // Used only by the primitives, so guarded by RecordStore's mutex.
  sqlite_internal::DbPtr db_;
};

}  // namespace granary

#pragma once

// RecordStore: the MetadataStore methods written once, over a backend's
// storage primitives. It validates what is written, stamps times from the
// Clock, encodes and decodes the JSON documents (metadata_store_internal.h),
// says where a damaged record lies, picks the event each change publishes,
// and words every "does not exist" / "already exists" error. A backend
// (RedisStore, SqliteStore) implements only the primitives below: each one
// atomic step on its storage (one Lua script or command, one SQLite
// transaction) that puts, reads or deletes stored documents together with the
// existence check and the event, plus Location() for corruption messages, url()
// and Watch().
//
// Why a base class rather than free helpers that both backends call: the logic
// above is the whole body of most MetadataStore methods, so with helpers each
// backend would still carry fifteen methods that validate, stamp, encode and
// map outcomes to errors, in step with the other backend's fifteen. Here a
// backend says what its storage does and nothing else, at the cost of one
// virtual call per operation (no extra round trip: a primitive is as coarse as
// the atomic step it stands for).
//
// Made only as a base of the backends; private to granary_core. Thread safety:
// as MetadataStore says. Every primitive runs with mu_ held, so a backend's
// connection needs no lock of its own, and a call may wait for another
// thread's call (its retries and backoff included). Watch() takes no lock: a
// watcher has its own connection.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "granary/core/metadata_store.h"

namespace granary::store_internal {

class RecordStore : public MetadataStore {
 public:
  // ---- what the primitives trade in ----

  enum class RecordKind : uint8_t {
    kDataset,   // name: dataset
    kNode,      // name: node id
    kProgress,  // name: dataset; key: node id
    kPlan,      // name: dataset; key: plan id
  };

  // A dataset as stored: its JSON document and the two numbers each backend
  // keeps beside it (EncodeDataset leaves them out).
  struct DatasetRow {
    std::string name;
    uint64_t revision = 0;
    int64_t created_ms = 0;
    std::string record;
  };

  struct NodeRow {
    std::string id;
    std::string record;
    // The copy of the pool SQLite keeps in a column to filter on; it must be
    // the record's. Absent where the backend keeps none (Redis).
    std::optional<std::string> pool_column;
  };

  // What a compare-and-set of a dataset's revision found.
  struct DatasetSwap {
    enum class Outcome : uint8_t { kSwapped, kAbsent, kRevisionDiffers };
    Outcome outcome = Outcome::kSwapped;
    int64_t created_ms = 0;  // kSwapped: the stored created_ms, which the swap keeps
  };

  enum class PlanErase : uint8_t { kErased, kNoDataset, kNoPlan };

  // ---- MetadataStore, written once ----

  Result<DatasetRecord> CreateDataset(const DatasetRecord& record) final;
  Result<DatasetRecord> GetDataset(std::string_view name) final;
  Result<std::vector<DatasetRecord>> ListDatasets() final;
  Result<DatasetRecord> UpdateDataset(const DatasetRecord& record) final;
  Status DeleteDataset(std::string_view name) final;

  Status PutManifest(std::string_view manifest_id, std::string_view bytes) final;
  Result<std::string> GetManifest(std::string_view manifest_id) final;

  Status Heartbeat(const NodeRecord& node, std::chrono::milliseconds ttl) final;
  Result<std::vector<NodeRecord>> ListNodes(std::string_view pool) final;
  Status RemoveNode(std::string_view node_id) final;
  Result<uint64_t> NodesVersion() final;

  Status PutProgress(std::string_view dataset, std::string_view node_id,
                     const StagingProgress& progress) final;
  Result<std::map<std::string, StagingProgress>> ListProgress(std::string_view dataset) final;

  Status PutPlan(std::string_view dataset, const PlanRecord& plan) final;
  Result<std::vector<PlanRecord>> ListPlans(std::string_view dataset) final;
  Status DeletePlan(std::string_view dataset, std::string_view plan_id) final;

 protected:
  // `clock` stamps records and must outlive the store.
  explicit RecordStore(Clock* clock) : clock_(clock) {}

  // ---- primitives ----
  // `what` says what the caller is doing ("put plan 'p' of dataset 'ds'"), for
  // the backend's own errors (unreachable, locked, a malformed reply). A write
  // publishes `event` in the same atomic step, and only if it changed
  // something. `record` is always a JSON document from metadata_store_internal.h.

  // Stores a new dataset with revision 1; false, changing nothing, if the name
  // is taken.
  virtual Result<bool> InsertDataset(std::string_view what, std::string_view name,
                                     int64_t created_ms, const std::string& record,
                                     const Event& event) = 0;
  // nullopt if absent. kCorruption (at Where) if the numbers kept beside the
  // record are not ones the store could have written.
  virtual Result<std::optional<DatasetRow>> ReadDataset(std::string_view what,
                                                        std::string_view name) = 0;
  // Calls `each` on every dataset in one snapshot, in any order, and returns the
  // first error it or `each` returns.
  virtual Status ReadDatasets(std::string_view what,
                              const std::function<Status(const DatasetRow&)>& each) = 0;
  // Sets revision and record if the stored revision is `expected_revision`,
  // keeping created_ms.
  virtual Result<DatasetSwap> SwapDataset(std::string_view what, std::string_view name,
                                          uint64_t expected_revision, uint64_t new_revision,
                                          const std::string& record, const Event& event) = 0;
  // Deletes the dataset with its progress and plans; false if it is absent.
  virtual Result<bool> EraseDataset(std::string_view what, std::string_view name,
                                    const Event& event) = 0;

  // Stores the blob unless its id is stored already. Publishes nothing.
  virtual Status WriteManifest(std::string_view what, std::string_view manifest_id,
                               std::string_view bytes) = 0;
  virtual Result<std::optional<std::string>> ReadManifest(std::string_view what,
                                                          std::string_view manifest_id) = 0;

  // Stores the node's record and `identity` (NodeIdentity), live for `ttl`
  // from `now_ms` (the time stamped into the record); publishes `event` only if
  // the node was not live or its identity differs.
  virtual Status WriteNode(std::string_view what, const NodeRecord& node,
                           const std::string& identity, const std::string& record, int64_t now_ms,
                           std::chrono::milliseconds ttl, const Event& event) = 0;
  // Calls `each` on live nodes in one snapshot, in any order: those of `pool`
  // or more (the caller filters), every pool when `pool` is empty. Returns the
  // first error it or `each` returns.
  virtual Status ReadNodes(std::string_view what, std::string_view pool,
                           const std::function<Status(const NodeRow&)>& each) = 0;
  // false if the node is not live.
  virtual Result<bool> EraseNode(std::string_view what, std::string_view node_id,
                                 const Event& event) = 0;
  // The membership version (MetadataStore::NodesVersion): bumped by
  // WriteNode when a node joins or changes identity, by EraseNode, and when
  // an expired node is swept; with expired nodes not swept yet counted in.
  virtual Result<uint64_t> ReadNodesVersion(std::string_view what) = 0;

  // Records under a dataset: `kind` is kProgress or kPlan, `key` the node or
  // plan id. Writing replaces; false, changing nothing, if the dataset does
  // not exist.
  virtual Result<bool> WriteChild(std::string_view what, RecordKind kind, std::string_view dataset,
                                  std::string_view key, const std::string& record,
                                  const Event& event) = 0;
  // key -> record; nullopt if the dataset does not exist.
  virtual Result<std::optional<std::map<std::string, std::string>>> ReadChildren(
      std::string_view what, RecordKind kind, std::string_view dataset) = 0;
  virtual Result<PlanErase> ErasePlan(std::string_view what, std::string_view dataset,
                                      std::string_view plan_id, const Event& event) = 0;

  // Where a record is kept, as a corruption message shows it in parentheses:
  // "key 'granary:node:n1'", "row 'ds', 'p' of table plans".
  virtual std::string Location(RecordKind kind, std::string_view name,
                               std::string_view key) const = 0;

  // "plan 'p' of dataset 'ds' (<Location>) in <url>": the `where` of every
  // record decoded, and of a backend's own corruption checks.
  std::string Where(RecordKind kind, std::string_view name, std::string_view key = {}) const;

 private:
  Result<DatasetRecord> Decode(const DatasetRow& row) const;
  Status PutChild(std::string_view what, RecordKind kind, std::string_view dataset,
                  std::string_view key, const std::string& record, EventKind event);
  Result<std::map<std::string, std::string>> ListChildren(std::string_view what, RecordKind kind,
                                                          std::string_view dataset);

  Clock* const clock_;
  std::mutex mu_;  // held around every primitive
};

}  // namespace granary::store_internal

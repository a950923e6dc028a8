#pragma once

// Valid metadata-store records for tests, with every field set to something
// other than its default so a field that does not round-trip shows.
//
// Thread safety: pure functions.

#include <string>
#include <vector>

#include "granary/core/metadata_store.h"

namespace granary::testing {

// Dataset `name` in pool "gpu-a": source file:///lustre/<name>, include and
// exclude globs, 4 MiB chunks, replication 2, snapshotted by the pool, owner
// 1000:100, Pending.
DatasetRecord MakeDataset(const std::string& name);

// Node `id` in `pool`, at <id>.cluster.local:7070, 4 TiB with 1 GiB used, two
// labels, a fixed started_ms.
NodeRecord MakeNode(const std::string& id, const std::string& pool = "default");

// Plan `id`: chunkwise, 64 ranks of batch 256, drop_last, window 4, and a seed
// above 2^63 (it must survive JSON exactly).
PlanRecord MakePlan(const std::string& id);

// How the backend tests damage stored records behind the store's back: the
// stored JSON of one record, with `from` replaced by `to`, must read back as
// kCorruption whose message contains `problem`. The records are those the
// Make* functions above give, stored as dataset "ds" (MakeDataset("ds")), its
// plan "p" (MakePlan("p")), its progress on node "node-1" (StagingProgress{})
// and node "node-1" (MakeNode("node-1")).
enum class StoredRecord { kDataset, kNode, kProgress, kPlan };
struct RecordCorruption {
  StoredRecord record;
  std::string from;
  std::string to;
  std::string problem;  // expected in the message
};
std::vector<RecordCorruption> RecordCorruptions();

}  // namespace granary::testing

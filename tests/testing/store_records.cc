#include "testing/store_records.h"

namespace granary::testing {

DatasetRecord MakeDataset(const std::string& name) {
  DatasetRecord r;
  r.name = name;
  r.spec.source_uri = "file:///lustre/" + name;
  r.spec.include = {"**/*.jpg", "**/*.png"};
  r.spec.exclude = {"tmp/**"};
  r.spec.chunk_size = 4 << 20;
  r.spec.pool = "gpu-a";
  r.spec.replication = 2;
  r.spec.snapshot_by = SnapshotBy::kPool;
  r.owner = {1000, 100};
  r.state = {DatasetPhase::kPending, "waiting for a snapshot", ""};
  return r;
}

NodeRecord MakeNode(const std::string& id, const std::string& pool) {
  NodeRecord n;
  n.id = id;
  n.pool = pool;
  n.address = id + ".cluster.local:7070";
  n.capacity_bytes = 4ull << 40;
  n.used_bytes = 1ull << 30;
  n.labels = {{"zone", "a"}, {"nvme", "4x"}};
  n.started_ms = 1'700'000'000'123;
  return n;
}

PlanRecord MakePlan(const std::string& id) {
  PlanRecord p;
  p.plan_id = id;
  p.seed = 0xfedcba9876543210ull;
  p.first_epoch = 3;
  p.world_size = 64;
  p.batch_size = 256;
  p.drop_last = true;
  p.mode = "chunkwise";
  p.window_chunks = 4;  // not the default, so a lost field shows
  return p;
}

std::vector<RecordCorruption> RecordCorruptions() {
  using R = StoredRecord;
  return {
      // Integers are range-checked before narrowing: 2^32 + 1 is not replication 1.
      {R::kDataset, R"("replication":2)", R"("replication":4294967297)",
       "spec.replication is '4294967297', not an integer from 0 to 4294967295"},
      {R::kDataset, R"("replication":2)", R"("replication":4294967296)", "spec.replication"},
      {R::kDataset, R"("replication":2)", R"("replication":0)", "spec.replication 0 is outside"},
      {R::kDataset, R"("chunk_size":4194304)", R"("chunk_size":0)", "spec.chunk_size 0 is outside"},
      {R::kDataset, R"("chunk_size":4194304)", R"("chunk_size":-4194304)", "spec.chunk_size"},
      {R::kDataset, R"("uid":1000)", R"("uid":-1)", "owner.uid is '-1'"},
      {R::kDataset, R"("gid":100)", R"("gid":100.5)", "owner.gid is '100.5'"},
      {R::kDataset, R"("name":"ds")", R"("name":"other")",
       "name is 'other' but the record is stored under 'ds'"},
      {R::kDataset, R"("phase":"Pending")", R"("phase":"Done")", "unknown dataset phase 'Done'"},
      {R::kDataset, R"("include":["**/*.jpg","**/*.png"])", R"("include":["[a"])",
       "unterminated '['"},
      {R::kDataset, R"("include":["**/*.jpg","**/*.png"])", R"("include":[7])",
       "spec.include is not a list of strings"},
      {R::kDataset, R"("pool":"gpu-a")", R"("pool":"GPU A")", "spec.pool"},
      {R::kDataset, R"("source_uri":"file:///lustre/ds")", R"("source_uri":"")",
       "spec.source_uri is empty"},
      {R::kDataset, R"("updated_ms":)", R"("updated_ms":"soon","x":)", "updated_ms is"},
      {R::kDataset, R"({"manifest_id")", R"({"manifest_id":"XYZ","old")", "manifest id 'XYZ'"},
      {R::kDataset, R"("spec":{)", R"("spec":7,"old":{)", "spec is not an object"},
      {R::kDataset, R"("owner":)", R"("renamed":)", "'owner' not found"},
      {R::kDataset, R"("snapshot_by":"pool")", R"("snapshot_by":"robot")",
       "unknown snapshot_by 'robot'"},
      {R::kDataset, R"("snapshot_by":"pool")", R"("snapshot_by":1)", "spec.snapshot_by is '1'"},
      {R::kDataset, R"("phase":"Pending")", R"("claimed_by":"bad id","phase":"Pending")",
       "state.claimed_by"},
      {R::kDataset, R"("owner":)", R"("readers":{"uids":[-1],"gids":[]},"owner":)",
       "readers.uids is not a list of uids or gids"},
      {R::kDataset, R"("owner":)", R"("readers":{"uids":[],"gids":[4294967296]},"owner":)",
       "readers.gids is not a list"},
      {R::kDataset, R"("owner":)", R"("readers":{"uids":[7,7],"gids":[]},"owner":)",
       "readers.uids is not sorted and unique at 7"},
      {R::kDataset, R"("owner":)", R"("readers":[],"owner":)", "readers is not an object"},
      {R::kDataset, R"("pool":"gpu-a")",
       R"("cache":{"priority":"high","pinned":false,"ttl_seconds":0,"min_resident_percent":0},"pool":"gpu-a")",
       "spec.cache.priority is"},
      {R::kDataset, R"("pool":"gpu-a")",
       R"("cache":{"priority":5000,"pinned":false,"ttl_seconds":0,"min_resident_percent":0},"pool":"gpu-a")",
       "spec.cache.priority 5000 is outside"},
      {R::kDataset, R"("pool":"gpu-a")",
       R"("cache":{"priority":0,"pinned":"yes","ttl_seconds":0,"min_resident_percent":0},"pool":"gpu-a")",
       "spec.cache.pinned is"},
      {R::kDataset, R"("pool":"gpu-a")",
       R"("cache":{"priority":0,"pinned":false,"ttl_seconds":-1,"min_resident_percent":0},"pool":"gpu-a")",
       "spec.cache.ttl_seconds is '-1'"},
      {R::kDataset, R"("pool":"gpu-a")",
       R"("cache":{"priority":0,"pinned":false,"ttl_seconds":0,"min_resident_percent":0.5},"pool":"gpu-a")",
       "spec.cache.min_resident_percent is '0.5'"},
      {R::kDataset, R"("pool":"gpu-a")",
       R"("cache":{"priority":0,"pinned":false,"ttl_seconds":0,"min_resident_percent":0,"max_resident_bytes":-5},"pool":"gpu-a")",
       "spec.cache.max_resident_bytes is '-5'"},
      {R::kDataset, R"("pool":"gpu-a")", R"("cache":[],"pool":"gpu-a")",
       "spec.cache is not an object"},
      {R::kDataset, R"("owner":)", R"("readers":{"gids":[]},"owner":)", "'uids' not found"},
      {R::kNode, R"("address":"node-1.cluster.local:7070")", R"("address":"nowhere")",
       "is not host:port"},
      {R::kNode, R"("id":"node-1")", R"("id":"node-2")",
       "id is 'node-2' but the record is stored under 'node-1'"},
      {R::kNode, R"("capacity_bytes":4398046511104)", R"("capacity_bytes":-1)",
       "capacity_bytes is '-1'"},
      {R::kNode, R"("labels":{)", R"("labels":{"n":1,)",
       "labels is not an object of string values"},
      {R::kProgress, R"("chunks_total":0)", R"("chunks_total":-1)", "chunks_total is '-1'"},
      {R::kProgress, R"("bytes_staged":0)", R"("bytes_staged":1e3)", "bytes_staged is '1000.0'"},
      {R::kProgress, R"({)", R"([{)", "parse error"},
      {R::kProgress, R"("chunks_total":0)",
       R"("chunks_total":0,"chunks_not_kept":3,"bytes_not_kept":0)",
       "chunks_not_kept or bytes_not_kept is more than the share"},
      {R::kProgress, R"("chunks_total":0)", R"("chunks_total":0,"chunks_not_kept":0)",
       "'bytes_not_kept' not found"},
      {R::kProgress, R"("chunks_total":0)", R"("chunks_total":0,"last_read_ms":"now")",
       "last_read_ms is"},
      {R::kPlan, R"("mode":"chunkwise")", R"("mode":"x")", "'x'"},
      {R::kPlan, R"("world_size":64)", R"("world_size":4294967360)", "world_size is '4294967360'"},
      {R::kPlan, R"("batch_size":256)", R"("batch_size":0)", "batch_size"},
      {R::kPlan, R"("window_chunks":4)", R"("window_chunks":0)", "window"},
      {R::kPlan, R"("drop_last":true)", R"("drop_last":1)", "drop_last is '1', not true or false"},
      {R::kPlan, R"("plan_id":"p")", R"("plan_id":"q")",
       "plan_id is 'q' but the record is stored under 'p'"},
  };
}

}  // namespace granary::testing

// SET_PLAN and PlanRecord from and to a PlanSpec (plan_request.h).

#include "granary/protocol/plan_request.h"

#include <utility>

namespace granary {

sidecar_protocol::SetPlan SetPlanFor(std::string plan_id, const PlanSpec& spec,
                                     uint64_t start_position) {
  sidecar_protocol::SetPlan set;
  set.plan_id = std::move(plan_id);
  set.seed = spec.seed;
  set.epoch = spec.epoch;
  set.world_size = spec.world_size;
  set.rank = spec.rank;
  set.batch_size = spec.batch_size;
  set.drop_last = spec.drop_last;
  set.mode = static_cast<uint8_t>(spec.mode);
  set.window_chunks = spec.window;
  set.start_position = start_position;
  return set;
}

PlanSpec PlanSpecOf(const sidecar_protocol::SetPlan& set) {
  PlanSpec spec;
  spec.seed = set.seed;
  spec.epoch = set.epoch;
  spec.world_size = set.world_size;
  spec.rank = set.rank;
  spec.batch_size = set.batch_size;
  spec.drop_last = set.drop_last;
  spec.mode = static_cast<PlanMode>(set.mode);
  spec.window = set.window_chunks;
  return spec;
}

PlanRecord PlanRecordOf(const sidecar_protocol::SetPlan& set) {
  const PlanSpec spec = PlanSpecOf(set);
  PlanRecord record;
  record.plan_id = set.plan_id;
  record.seed = spec.seed;
  record.first_epoch = static_cast<uint32_t>(spec.epoch);
  record.world_size = spec.world_size;
  record.batch_size = spec.batch_size;
  record.drop_last = spec.drop_last;
  record.mode = std::string(PlanModeName(spec.mode));
  record.window_chunks = spec.window;
  return record;
}

}  // namespace granary

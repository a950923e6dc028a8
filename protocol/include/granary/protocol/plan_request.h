#pragma once

// A plan as the messages and records that carry it: the sidecar protocol's
// SET_PLAN (sidecar_protocol.h), which names one rank's read of one epoch, and
// the store's PlanRecord (metadata_store.h), which the sidecar registers so
// cache nodes stage in the plan's order. The one place their fields are
// copied from and to a PlanSpec (plan.h): the client builds SET_PLAN with
// SetPlanFor, the sidecar reads it with PlanSpecOf and PlanRecordOf.
//
// Thread safety: pure functions.

#include <cstdint>
#include <string>

#include "granary/core/metadata_store.h"
#include "granary/core/plan.h"
#include "granary/protocol/sidecar_protocol.h"

namespace granary {

// The SET_PLAN that asks for rank spec.rank's read of epoch spec.epoch of
// plan `plan_id`, resuming at `start_position` (an index into the rank's
// samples). Not validated: the sidecar validates what it is sent.
sidecar_protocol::SetPlan SetPlanFor(std::string plan_id, const PlanSpec& spec,
                                     uint64_t start_position);

// The PlanSpec a SET_PLAN asks for. Not validated: Plan::Create (or
// ValidatePlanSpec) says what is wrong with it, e.g. an unknown mode.
PlanSpec PlanSpecOf(const sidecar_protocol::SetPlan& set);

// The PlanRecord a SET_PLAN registers: its plan from its epoch on (first_epoch,
// cut to 32 bits as epochs are). For a SET_PLAN whose PlanSpecOf is valid;
// registered_ms is left for the store.
PlanRecord PlanRecordOf(const sidecar_protocol::SetPlan& set);

}  // namespace granary

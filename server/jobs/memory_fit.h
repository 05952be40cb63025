// CreateJob's memory gate: a job that the planner's own memory model says cannot fit the
// cluster's devices is refused at create (FAILED_PRECONDITION), instead of being scheduled and
// dying of an allocation failure on every restart.
//
// The model is the planner's (server/planner/memory_model.h and the backends' exact layouts),
// evaluated for the job's layout: the explicit sizes and micro-batch of the spec, or, for `auto`,
// every layout the runtime could run (recompute none, ZeRO-1 off, as auto_plan.h searches).
// The planner is advice elsewhere; here it gates only what it can judge: when it cannot plan the
// job at all (an unknown GPU model, a device count that is not whole nodes), the job is accepted
// as before.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"

namespace loom::jobs {

// OK when the job fits (or the planner cannot judge). FAILED_PRECONDITION naming
// spec.resources, the least memory needed per device and what to change otherwise.
// `accepted` and `layout` as validated (and planned, for auto); `nodes`: the registered nodes
// (READY ones count). Pure.
absl::Status CheckMemoryFit(const v1::JobSpec& accepted, const v1::Layout& layout, bool auto_layout,
                            const std::vector<v1::Node>& nodes);

}  // namespace loom::jobs

// CreateJob with `parallelism: {auto: {}}`: the planner chooses the job's layout on the live
// cluster, with the efficiency table calibrated from finished jobs (server/calibration), and its
// plan (layout, prediction, calibration) is stored in the job.
//
// The training runtime runs data parallelism only for now, so the search is constrained to
// tp = pp = 1, recompute none, ZeRO-1 off (kAutoRunsDataParallelOnly in auto_plan.cc: setting it
// to false lets the planner choose data, tensor and pipeline sizes, recompute and ZeRO-1, and the
// job runs the plan's layout); within that it picks the micro-batch and the number of
// micro-batches. The planner is advice, never a gate: when it cannot plan a job that validated
// (unknown device model, a memory model that says it does not fit, a micro-batch that disagrees
// with the spec's batch), the job keeps the validator's default layout and `note` says why.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"
#include "server/planner_service/plan_mapping.h"

namespace loom::jobs {

struct AutoPlanOutcome {
  v1::Layout layout;             // the layout to run with
  std::optional<v1::Plan> plan;  // the planner's chosen plan, when it could plan
  std::string note;              // empty when the plan was used; else why not, one line
};

// Whether a validated spec asked for `auto` (explicitly, or by giving no sizes): the validator
// fills data/tensor/pipeline for explicit sizes only.
bool IsAutoLayout(const v1::JobSpec& accepted);

// `requested`: the spec as the user sent it (a micro_batch given there is honoured);
// `accepted` and `default_layout`: as validated; `nodes`: the registered nodes (READY ones
// count); `calibrations`: by device model, as Calibrator::Applicable() gives them (empty: the
// catalog's defaults). Pure; never fails.
AutoPlanOutcome PlanAutoLayout(const v1::JobSpec& requested, const v1::JobSpec& accepted,
                               const v1::Layout& default_layout, const std::vector<v1::Node>& nodes,
                               const planner_service::CalibrationByModel& calibrations = {});

}  // namespace loom::jobs

// The one translation between the API (JobSpec, PlanJobResponse, Plan) and the planner's plain
// structs (planner::PlanRequest, PlanResult, Evaluation). loomd's PlanJob and CreateJob with
// `auto`, and `loomctl plan --cluster` offline, all plan through PlanJobOnDevices, so the two
// paths share one implementation.
//
// What a spec means to the planner:
//  - model: the preset or the five dimensions; train.seq_len, when set, is the sequence length
//    planned for (at most the model's seq_len).
//  - devices: resources.gpus or resources.cpu_devices of the cluster's kind (none: the whole
//    cluster); more than the cluster has is FAILED_PRECONDITION.
//  - precision: train.precision, default bf16 on GPUs and fp32 on CPU devices (as the
//    validator's default).
//  - batch: train.global_batch_tokens, default 8 sequences per data-parallel rank of the layout
//    the spec names (every device data-parallel under `auto`), as the validator's default.
//  - constraints: parallelism.data, tensor, pipeline and micro_batch when > 0.
//  - calibration: loomd passes the calibration of the cluster's device model (Calibrator,
//    server/calibration) and every plan carries it (Plan.calibration, and a reason on the first
//    plan); `loomctl plan --cluster` offline passes none and plans with the catalog's defaults.
//
// Pure functions; errors are INVALID_ARGUMENT (the spec is wrong) or FAILED_PRECONDITION (the
// devices cannot run it), naming the field and the fix.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"
#include "server/planner/device_spec.h"
#include "server/planner/layout_search.h"

namespace loom::planner_service {

inline constexpr int kDefaultTopK = 5;
inline constexpr int kMaxTopK = 50;

// Calibrations by device model (calibration::Calibrator::Applicable()).
using CalibrationByModel = std::map<std::string, v1::PlanCalibration, std::less<>>;

// The calibration of `devices`' model among `calibrations`, or the catalog's (jobs 0, scales 1)
// when it has none.
v1::PlanCalibration CalibrationFor(const planner::DeviceSpec& devices,
                                   const CalibrationByModel& calibrations);

// `devices` with the efficiency table scaled by `calibration` (planner::ScaleEfficiency).
planner::DeviceSpec Calibrated(planner::DeviceSpec devices, const v1::PlanCalibration& calibration);

// One line for a plan's reasons: "efficiency calibrated from 3 finished jobs on cpu: compute
// ×7.40 the catalog's prediction", or that the catalog's defaults are in use.
std::string CalibrationReason(const v1::PlanCalibration& calibration);

// The planner's request for `spec` on `cluster` (a DeviceSpec of the whole cluster: its count
// is every device; the request's count is the job's). `top_k` 0 means kDefaultTopK.
absl::StatusOr<planner::PlanRequest> PlanRequestFromSpec(const v1::JobSpec& spec,
                                                         const planner::DeviceSpec& cluster,
                                                         int top_k);

// One evaluated layout as the API's Plan (reasons left empty).
v1::Plan PlanFromEvaluation(const planner::Evaluation& evaluation);

// A layout as the API's Layout (data, tensor, pipeline, micro-batching, recompute, zero1,
// schedule, stage boundaries).
v1::Layout LayoutFromEvaluation(const planner::Evaluation& evaluation);

// The response for a result of `request`: `ranked` becomes `plans` (with reasons saying how
// each compares with the first), `rejected` one line each. `constrained` is the best layout
// that honours the spec's constraints, when it has any. `calibration`, when given, is what
// `request.devices` was calibrated with: set in every plan, and a reason of the first plan and
// of the constrained one.
v1::PlanJobResponse ResponseFromResult(const planner::PlanRequest& request,
                                       const planner::PlanResult& unconstrained,
                                       const planner::PlanResult* constrained,
                                       const v1::PlanCalibration* calibration = nullptr);

// Plans `spec` on `cluster`: the unconstrained ranking, and, when the spec fixes part of the
// layout, that layout's best completion beside it. The PlanJob RPC (with the live cluster or a
// ClusterDescription) and `loomctl plan --cluster` both call this. With `calibration`, the
// cluster's efficiency table is scaled by it first (loomd); without, the catalog's (offline).
absl::StatusOr<v1::PlanJobResponse> PlanJobOnDevices(
    const v1::JobSpec& spec, const planner::DeviceSpec& cluster, int top_k,
    const v1::PlanCalibration* calibration = nullptr);

// The PlanJob RPC: `request.cluster` when present, else the devices of the spec's kind on the
// READY nodes among `live_nodes`; calibrated with the devices' model's entry of `calibrations`
// (the catalog's defaults when it has none; a described cluster of a model loomd has learnt
// is calibrated too). INVALID_ARGUMENT for a missing spec or a bad top_k.
absl::StatusOr<v1::PlanJobResponse> PlanJob(const v1::PlanJobRequest& request,
                                            const std::vector<v1::Node>& live_nodes,
                                            const CalibrationByModel& calibrations = {});

}  // namespace loom::planner_service

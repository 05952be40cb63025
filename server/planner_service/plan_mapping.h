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
//
// Pure functions; errors are INVALID_ARGUMENT (the spec is wrong) or FAILED_PRECONDITION (the
// devices cannot run it), naming the field and the fix.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include <vector>

#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"
#include "server/planner/device_spec.h"
#include "server/planner/layout_search.h"

namespace loom::planner_service {

inline constexpr int kDefaultTopK = 5;
inline constexpr int kMaxTopK = 50;

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
// that honours the spec's constraints, when it has any.
v1::PlanJobResponse ResponseFromResult(const planner::PlanRequest& request,
                                       const planner::PlanResult& unconstrained,
                                       const planner::PlanResult* constrained);

// Plans `spec` on `cluster`: the unconstrained ranking, and, when the spec fixes part of the
// layout, that layout's best completion beside it. The PlanJob RPC (with the live cluster or a
// ClusterDescription) and `loomctl plan --cluster` both call this.
absl::StatusOr<v1::PlanJobResponse> PlanJobOnDevices(const v1::JobSpec& spec,
                                                     const planner::DeviceSpec& cluster,
                                                     int top_k);

// The PlanJob RPC: `request.cluster` when present, else the devices of the spec's kind on the
// READY nodes among `live_nodes`. INVALID_ARGUMENT for a missing spec or a bad top_k.
absl::StatusOr<v1::PlanJobResponse> PlanJob(const v1::PlanJobRequest& request,
                                            const std::vector<v1::Node>& live_nodes);

}  // namespace loom::planner_service

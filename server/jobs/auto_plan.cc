#include "server/jobs/auto_plan.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/planner/layout_search.h"
#include "server/planner_service/cluster_devices.h"

namespace loom::jobs {
namespace {

// loom-train runs data, tensor and pipeline parallelism (1F1B or GPipe, any stage boundaries)
// and ZeRO-1, but no activation recomputation yet, and its ZeRO-1 reduce-scatters the gradients
// after backward instead of overlapping them (exposed time the planner's time model does not
// charge): auto lets the planner choose dp, tp, pp, the micro-batching and the stages, and keeps
// recompute and ZeRO-1 off. Set to true to go back to plain data parallelism.
constexpr bool kAutoRunsDataParallelOnly = false;

// Shown in the plan's reasons while the switch is on.
constexpr char kRuntimeLimit[] =
    "auto is constrained to tensor = pipeline = 1, recompute none, ZeRO-1 off: the training "
    "runtime runs data parallelism only for now";

// Shown in the plan's reasons when the switch is off.
constexpr char kNoRecompute[] =
    "auto keeps recompute none and ZeRO-1 off: loom-train has no activation recomputation yet, "
    "and its ZeRO-1 does not overlap the gradient reduce-scatter with backward";

AutoPlanOutcome KeepDefault(const v1::Layout& default_layout, const std::string& why) {
  AutoPlanOutcome out;
  out.layout = default_layout;
  out.note = absl::StrCat("planner not used (", why,
                          "); running the default data-parallel "
                          "layout");
  return out;
}

}  // namespace

bool IsAutoLayout(const v1::JobSpec& accepted) { return accepted.parallelism().data() == 0; }

AutoPlanOutcome PlanAutoLayout(const v1::JobSpec& requested, const v1::JobSpec& accepted,
                               const v1::Layout& default_layout, const std::vector<v1::Node>& nodes,
                               const planner_service::CalibrationByModel& calibrations) {
  const v1::DeviceKind kind =
      accepted.resources().gpus() > 0 ? v1::DEVICE_KIND_GPU : v1::DEVICE_KIND_CPU;
  absl::StatusOr<planner::DeviceSpec> devices = planner_service::DevicesFromNodes(nodes, kind);
  if (!devices.ok()) return KeepDefault(default_layout, std::string(devices.status().message()));
  const v1::PlanCalibration calibration = planner_service::CalibrationFor(*devices, calibrations);

  // The validator filled micro_batch with its default; only the user's own is a constraint.
  v1::JobSpec spec = accepted;
  spec.mutable_parallelism()->set_micro_batch(requested.parallelism().micro_batch());
  absl::StatusOr<planner::PlanRequest> request = planner_service::PlanRequestFromSpec(
      spec, planner_service::Calibrated(*devices, calibration), /*top_k=*/1);
  if (!request.ok()) return KeepDefault(default_layout, std::string(request.status().message()));
  request->fixed.recompute = planner::Recompute::kNone;
  request->fixed.zero1 = false;
  if (kAutoRunsDataParallelOnly) {
    request->fixed.tp = 1;
    request->fixed.pp = 1;
  }
  absl::StatusOr<planner::PlanResult> result = planner::PlanLayouts(*request);
  if (!result.ok()) return KeepDefault(default_layout, std::string(result.status().message()));
  if (result->ranked.empty()) return KeepDefault(default_layout, "no layout fits");

  const planner::Evaluation& best = result->ranked.front();
  const int64_t sequences =
      int64_t{best.layout.dp} * best.layout.micro_batch * best.layout.num_micro_batches;
  const int64_t tokens = sequences * accepted.train().seq_len();
  // Data-parallel only, the validator's data size is the whole world and must stay so.
  if ((kAutoRunsDataParallelOnly && best.layout.dp != default_layout.data()) ||
      tokens != accepted.train().global_batch_tokens()) {
    return KeepDefault(default_layout,
                       absl::StrCat("its layout ", planner::LayoutString(best.layout),
                                    " disagrees with the spec's global batch of ",
                                    accepted.train().global_batch_tokens(), " tokens"));
  }
  AutoPlanOutcome out;
  out.layout = default_layout;
  const v1::Layout planned = planner_service::LayoutFromEvaluation(best);
  out.layout.set_data(planned.data());
  out.layout.set_tensor(planned.tensor());
  out.layout.set_pipeline(planned.pipeline());
  out.layout.set_micro_batch(planned.micro_batch());
  out.layout.set_num_micro_batches(planned.num_micro_batches());
  out.layout.set_recompute(planned.recompute());
  out.layout.set_zero1(planned.zero1());
  out.layout.set_schedule(planned.schedule());
  *out.layout.mutable_blocks_per_stage() = planned.blocks_per_stage();
  v1::PlanJobResponse response =
      planner_service::ResponseFromResult(*request, *result, nullptr, &calibration);
  v1::Plan plan = std::move(*response.mutable_plans(0));
  plan.add_reasons(kAutoRunsDataParallelOnly ? kRuntimeLimit : kNoRecompute);
  out.plan = std::move(plan);
  return out;
}

}  // namespace loom::jobs

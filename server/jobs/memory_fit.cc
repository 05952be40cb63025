#include "server/jobs/memory_fit.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "server/planner/layout_search.h"
#include "server/planner_service/cluster_devices.h"
#include "server/planner_service/plan_mapping.h"

namespace loom::jobs {

absl::Status CheckMemoryFit(const v1::JobSpec& accepted, const v1::Layout& layout, bool auto_layout,
                            const std::vector<v1::Node>& nodes) {
  const v1::DeviceKind kind =
      accepted.resources().gpus() > 0 ? v1::DEVICE_KIND_GPU : v1::DEVICE_KIND_CPU;
  absl::StatusOr<planner::DeviceSpec> devices = planner_service::DevicesFromNodes(nodes, kind);
  if (!devices.ok() || devices->memory_bytes <= 0) return absl::OkStatus();
  v1::JobSpec spec = accepted;
  if (auto_layout) {
    // What auto may choose from: any sizes and micro-batch, as auto_plan.cc searches.
    spec.mutable_parallelism()->clear_data();
    spec.mutable_parallelism()->clear_tensor();
    spec.mutable_parallelism()->clear_pipeline();
    spec.mutable_parallelism()->clear_micro_batch();
  }
  absl::StatusOr<planner::PlanRequest> request =
      planner_service::PlanRequestFromSpec(spec, *devices, /*top_k=*/1);
  if (!request.ok()) return absl::OkStatus();
  // loom-train has no activation recomputation: only what it runs counts.
  request->fixed.recompute = planner::Recompute::kNone;
  if (auto_layout) {
    request->fixed.zero1 = false;
  } else {
    request->fixed.dp = layout.data();
    request->fixed.tp = layout.tensor();
    request->fixed.pp = layout.pipeline();
    request->fixed.micro_batch = layout.micro_batch();
    request->fixed.zero1 = layout.zero1();
  }
  absl::StatusOr<planner::PlanResult> result = planner::PlanLayouts(*request);
  if (result.ok() || !absl::IsFailedPrecondition(result.status())) return absl::OkStatus();
  const char* field =
      kind == v1::DEVICE_KIND_GPU ? "spec.resources.gpus" : "spec.resources.cpu_devices";
  return absl::FailedPreconditionError(absl::StrCat(
      field, ": by the planner's memory model (loomctl plan shows the details), ",
      result.status().message(),
      "; ask for more devices, use tensor or pipeline parallelism, a smaller micro_batch or "
      "global_batch_tokens, or a smaller model"));
}

}  // namespace loom::jobs
